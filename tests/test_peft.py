"""LoRA on NVFP4 models through peft (nvfp4_gemm.peft): which layers get wrapped, that only the adapters train,
that training lowers the loss, the save / load round trip, merge refused with its reason; on models from
quantize_model and from from_pretrained."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

try:
    import peft
    from peft import LoraConfig
except ImportError as e:  # noqa: F841
    pytest.skip("peft is not installed: `pip install --no-deps peft==0.21.2 accelerate==1.15.0` "
                "(scripts/install.sh does)", allow_module_level=True)

transformers = pytest.importorskip("transformers")

import nvfp4_gemm  # noqa: E402
from nvfp4_gemm import NVFP4Linear, quantize_model  # noqa: E402
from nvfp4_gemm.peft import LoraNVFP4Linear, get_peft_model, load_adapter  # noqa: E402
from nvfp4_gemm.testing import tiny_causal_lm  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls on a shared 2-core CI machine stall in torch's thread pool (measured 3-10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def nvfp4_llama(seed: int, weight_only: bool = True) -> nn.Module:
    model = tiny_causal_lm("llama", seed)
    return quantize_model(model, filter=lambda name, _: name != "lm_head", weight_only=weight_only, progress=False)


def batch(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # A repeating pattern the adapters can learn quickly: the loss must fall within a few steps.
    base = torch.randint(0, 256, (8,), generator=g)
    return base.repeat(4, 3)[:, :20]


def config(**kw) -> LoraConfig:
    return LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, lora_dropout=0.0, **kw)


def train(model, ids, steps: int, lr: float = 1e-2) -> list[float]:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    model.eval()
    return losses


@pytest.mark.parametrize("weight_only", [True, False], ids=["weight_only", "dynamic"])
def test_lora_wraps_trains_saves_and_loads(tmp_path, weight_only):
    model = get_peft_model(nvfp4_llama(1, weight_only), config())
    wrapped = {n for n, m in model.named_modules() if isinstance(m, LoraNVFP4Linear)}
    assert len(wrapped) == 2 * len(TARGETS), sorted(wrapped)
    for _, m in model.named_modules():
        if isinstance(m, LoraNVFP4Linear):
            assert isinstance(m.base_layer, NVFP4Linear)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable), sorted(trainable)[:5]
    frozen = {n: t.clone() for n, t in model.state_dict().items() if "lora_" not in n}

    ids = batch(2)
    losses = train(model, ids, steps=12)
    assert losses[-1] < 0.8 * losses[0], losses
    # The base did not move: weights, scales, norms, embeddings.
    for n, t in model.state_dict().items():
        if n in frozen:
            assert torch.equal(t, frozen[n]), n

    with torch.no_grad():
        want = model(input_ids=ids).logits
    model.save_pretrained(tmp_path / "adapter")
    saved = (tmp_path / "adapter" / "adapter_model.safetensors")
    assert saved.exists() and saved.stat().st_size < 200_000  # adapters only, not the base

    reloaded = load_adapter(nvfp4_llama(1, weight_only), str(tmp_path / "adapter"))
    assert isinstance(reloaded, peft.PeftModel)
    assert sum(isinstance(m, LoraNVFP4Linear) for m in reloaded.modules()) == 2 * len(TARGETS)
    with torch.no_grad():
        got = reloaded(input_ids=ids).logits
    assert torch.equal(got, want)
    # And the adapters matter: without them the outputs differ.
    with torch.no_grad(), reloaded.disable_adapter():
        assert not torch.equal(reloaded(input_ids=ids).logits, want)


def test_lora_output_is_base_plus_scaled_update():
    """y = NVFP4Linear(x) + scaling * B(A(x)), B and A set to random values (peft initialises B to zero)."""
    model = get_peft_model(nvfp4_llama(3), config())
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    torch.manual_seed(4)
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        got = layer(x)
        want = layer.base_layer(x) + (x @ layer.lora_A["default"].weight.T @ layer.lora_B["default"].weight.T) * 2.0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_merge_is_refused_with_the_reason():
    model = get_peft_model(nvfp4_llama(5), config())
    before = {n: t.clone() for n, t in model.state_dict().items()}
    with pytest.raises(NotImplementedError, match=re.escape("merging a LoRA adapter into an NVFP4Linear is not supported")):
        model.merge_and_unload()
    for n, t in model.state_dict().items():
        assert torch.equal(t, before[n]), n
    base = model.unload()  # without merging: the NVFP4 model as it was
    assert sum(isinstance(m, NVFP4Linear) for m in base.modules()) == 2 * len(TARGETS)
    assert not any(isinstance(m, LoraNVFP4Linear) for m in base.modules())


def test_dora_is_refused():
    with pytest.raises(ValueError, match="supports plain LoRA only"):
        get_peft_model(nvfp4_llama(6), config(use_dora=True))


def test_lora_on_from_pretrained_model(tmp_path):
    """A checkpoint saved by save_pretrained and loaded by from_pretrained takes adapters the same way."""
    model = nvfp4_llama(7)
    nvfp4_gemm.save_pretrained(model, tmp_path / "ckpt", format="modelopt")
    loaded = nvfp4_gemm.from_pretrained(str(tmp_path / "ckpt"), weight_only=True)
    loaded = get_peft_model(loaded, config())
    assert sum(isinstance(m, LoraNVFP4Linear) for m in loaded.modules()) == 2 * len(TARGETS)
    losses = train(loaded, batch(8), steps=8)
    assert losses[-1] < losses[0], losses


def test_lora_finetune_example_on_a_tiny_model(tmp_path, capsys):
    """examples/lora_finetune.py end to end, a few steps: the loss falls, the adapters reload to the same logits."""
    import importlib.util
    import json
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "lora_finetune.py")
    spec = importlib.util.spec_from_file_location("lora_finetune_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = tmp_path / "result.json"
    result = example.main(["--model", "tiny", "--steps", "20", "--seq-len", "32", "--batch", "4", "--log-every", "10",
                           "--out", str(tmp_path / "adapter"), "--json", str(out)])
    assert json.loads(out.read_text())["losses"] == result["losses"]
    assert len(result["losses"]) == 20
    first, last = sum(result["losses"][:5]) / 5, sum(result["losses"][-5:]) / 5
    assert last < first - 0.05, result["losses"]
    assert result["held_out_after"] < result["held_out_before"] - 0.05, result
    assert result["reload_identical"] is True
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    captured = capsys.readouterr()
    assert "step 20/20: train loss" in captured.out + captured.err
    assert "20/20" in captured.err  # the progress bar
