"""`python -m nvfp4_gemm generate`: a producer's checkpoint directory (tests/fixtures/producers, with the
128-token BPE tokenizer its maker trained offline) loads, generates greedily and reports tokens/s; a
directory without a tokenizer or without a checkpoint is refused with the reason."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from nvfp4_gemm.__main__ import main

pytest.importorskip("transformers")
HERE = os.path.dirname(os.path.abspath(__file__))
CKPT = os.path.join(HERE, "fixtures", "producers", "llmc-nvfp4a16")
PROMPT = "Alice was beginning to get very tired"


def test_generate_prints_the_greedy_continuation_and_speed(capsys):
    from transformers import AutoTokenizer

    from nvfp4_gemm.checkpoint import from_pretrained

    assert main(["generate", CKPT, "--prompt", PROMPT, "--max-new-tokens", "6", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    tok = AutoTokenizer.from_pretrained(CKPT)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    model = from_pretrained(CKPT, progress=False)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                              pad_token_id=tok.eos_token_id)
    assert out == tok.decode(want[0], skip_special_tokens=True) + "\n"
    n_new = want.shape[1] - ids.shape[1]
    assert f"{n_new} new tokens in " in err and " tokens/s (prompt " in err
    assert "NVFP4 layers" in err  # the loading progress bar


def test_generate_refuses_a_directory_without_tokenizer(tmp_path, capsys):
    d = tmp_path / "no_tokenizer"
    shutil.copytree(CKPT, d)
    for f in os.listdir(d):
        if f.startswith("tokenizer"):
            os.remove(d / f)
    assert main(["generate", str(d), "--prompt", PROMPT]) == 2
    assert "no tokenizer in the directory" in capsys.readouterr().err
    assert main(["generate", str(tmp_path / "nowhere"), "--prompt", PROMPT]) == 2
    assert "not a checkpoint directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", CKPT, "--prompt", PROMPT, "--max-new-tokens", "0"])


def test_generate_as_a_command():
    r = subprocess.run([sys.executable, "-m", "nvfp4_gemm", "generate", CKPT, "--prompt", PROMPT,
                        "--max-new-tokens", "3", "--device", "cpu"], capture_output=True, text=True, timeout=300,
                       cwd=os.path.dirname(HERE))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("Alice") and "tokens/s" in r.stderr
