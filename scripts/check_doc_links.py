"""Every relative markdown link target in the repository's .md files exists (anchors ignored).

Usage: python3 scripts/check_doc_links.py [REPO_ROOT]   (default: the repository this script is in)
"""
import os, re, subprocess, sys
root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
files = subprocess.run(["git", "-C", root, "ls-files", "*.md"], capture_output=True, text=True).stdout.split()
files += subprocess.run(["git", "-C", root, "ls-files", "--others", "--exclude-standard", "*.md"], capture_output=True, text=True).stdout.split()
bad = n = 0
link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
for f in files:
    if f.startswith("third_party/"): continue
    text = open(os.path.join(root, f)).read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for m in link.finditer(text):
        t = m.group(1)
        if re.match(r"^[a-z]+:", t) or t.startswith("#"): continue
        n += 1
        p = os.path.normpath(os.path.join(root, os.path.dirname(f), t.split("#")[0]))
        if not os.path.exists(p):
            bad += 1; print(f"{f}: broken link -> {t}")
print(f"{n} relative links checked, {bad} broken")
sys.exit(1 if bad else 0)
