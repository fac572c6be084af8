"""NVFP4 experts for transformers' mixture-of-experts models (Qwen3-MoE, Qwen2-MoE, Mixtral, DeepSeek-V3).

    nvfp4_gemm.quantize_model(model)                  # also swaps every experts module (quantize_experts)
    nvfp4_gemm.moe.quantize_experts(model, weight_only=True)

transformers 5 keeps a MoE layer's routed experts in one module (`mlp.experts`, decorated with
`use_experts_implementation`) holding two 3-D parameters, `gate_up_proj [E, 2I, H]` (gate = the first I rows)
and `down_proj [E, H, I]`, called as `experts(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])`
by its MoE block after the router. NVFP4Experts replaces that module in place (as NVFP4Linear replaces
nn.Linear): the router (`mlp.gate`) and everything around the experts stay as transformers has them, hooks on
the MoE block keep working, and the experts' forward has the same signature. The router stays float, with its
parameter, hooks and state_dict keys; where it is one of the softmax top-k routers read (Qwen3-MoE, Qwen2-MoE,
Mixtral), its class becomes a subclass of its own whose forward runs the softmax, top-k, renormalization and cast
as one op after the logits GEMM (`_moe_topk`, fuse_routers), with the same outputs. Shared experts (Qwen2-MoE's
`shared_expert`, DeepSeek-V3's `shared_experts`) are ordinary MLPs of nn.Linear layers: quantize_model turns
them into NVFP4Linear like any other.

Buffers (state_dict; E experts, H hidden, I intermediate):
    gate_up_proj                uint8 [E, 2I, H/2]        packed e2m1, gate rows first
    gate_up_proj_weight_scale   float8_e4m3fn [E, S1]     each expert's blocked [2I, H/16] scales
    gate_up_proj_weight_scale_2 float32 [E, 2]            per expert, per part (gate, up): weight DECODE scale
    gate_up_proj_input_scale    float32 [E, 2]            static W4A4 only: per expert, per part input decode scale
    down_proj                   uint8 [E, H, I/2]
    down_proj_weight_scale      float8_e4m3fn [E, S2]     each expert's blocked [H, I/16] scales
    down_proj_weight_scale_2    float32 [E]
    down_proj_input_scale       float32 [E]               static W4A4 only
Each expert keeps its own per-tensor scales; gate and up of one expert may share theirs (quantize_model does,
as ModelOpt's and llm-compressor's exports do) or not (a checkpoint that did not).

Forward, all on the device, no host sync (CUDA-graph and torch.compile safe):
    route   the T*k (token, expert) pairs sorted by expert (stable), the per-expert row ends offs, the token of
            each sorted row and the sorted row of each pair: one _moe_route call (one kernel at decode sizes)
    gate_up grouped GEMM of the gathered rows: [S, 2I]; SiLU(gate) * up in x's dtype (transformers' order)
    down    grouped GEMM: [S, H]; times the top-k weight in fp32, the k rows of a token summed in fp32,
            rounded once to x's dtype (transformers' grouped_mm backend sums the same way)
Modes (as NVFP4Linear's, per expert):
  * weight-only: the GEMMs read x / the intermediate in their float dtype; alpha = weight_scale_2 of the expert.
  * static W4A4: each row is quantized with its expert's input scale (encode 1 / input_scale); alpha =
    fl(input_scale * weight_scale_2) of the expert, formed as nvfp4_gemm.linear forms it.
  * dynamic W4A4: one encode scale per call and GEMM, 2688 / the finite amax of that GEMM's whole input (the
    T tokens for gate_up, the S intermediate rows for down), as a dynamic NVFP4Linear called on that tensor.
In every mode row t of expert e is bit for bit what NVFP4Linear of expert e's weights computes for it (the
tests check quantize-then-mm per expert). Where gate and up of an expert have different weight_scale_2 (or
different static input scales) the gate_up GEMM runs into float32 without alpha and each part's columns are
multiplied by that part's own alpha before the one rounding (nvfp4_gemm.fused's per-part recipe): never one
scale used for both.
Where one encode scale serves every row (dynamic, or static with one input scale for all experts, which is
how ModelOpt calibrates experts), the T tokens are quantized once (the native quantize op) and the packed
rows gathered, instead of quantizing the k-times larger gathered copy; they do so only for gate_up past
_FUSED_SHARED_ROWS gathered rows, and otherwise take the fused quantize + GEMM op as per-expert scales do (the
same bits, fewer launches; dynamic: the op's one scale from all its input rows, which hold every token).
"""
from __future__ import annotations

import logging
import re

import torch
from torch import nn

from . import methods
from .formats import blocked_shape, from_blocked, to_blocked
from .grouped import quantize_grouped, to_blocked_grouped
from .nn import check_method
from .quantize import E2M1_MAX, E4M3_MAX, finite_amax, global_encode_scale, quantize

log = logging.getLogger(__name__)

# transformers model package -> the family's name (the experts modules whose forward was read: transformers 5.17
# to 5.23 Qwen3MoeExperts, Qwen2MoeExperts, MixtralExperts, DeepseekV3Experts, all the same computation)
FAMILIES = {"qwen3_moe": "Qwen3-MoE", "qwen2_moe": "Qwen2-MoE", "mixtral": "Mixtral", "deepseek_v3": "DeepSeek-V3"}
_MODEL_PACKAGE = re.compile(r"transformers\.models\.(\w+)\.modeling_")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------------------------
# Which modules are experts


def looks_like_experts(mod: nn.Module) -> bool:
    """A transformers-5 experts module: 3-D gate_up_proj [E, 2I, H] and down_proj [E, H, I] parameters."""
    gu, dn = getattr(mod, "gate_up_proj", None), getattr(mod, "down_proj", None)
    return (isinstance(gu, torch.Tensor) and isinstance(dn, torch.Tensor) and not isinstance(mod, NVFP4Experts)
            and gu.dim() == 3 and dn.dim() == 3)


def family_of(mod: nn.Module) -> str | None:
    m = _MODEL_PACKAGE.match(type(mod).__module__ or "")
    return m.group(1) if m else None


def unsupported_reason(mod: nn.Module) -> str | None:
    """None if NVFP4Experts can replace this experts module, else why not (for the error message)."""
    fam = family_of(mod)
    if fam not in FAMILIES:
        return (f"{type(mod).__name__} ({type(mod).__module__}) is not of a supported MoE family; NVFP4 experts "
                f"support {', '.join(FAMILIES.values())}")
    for flag, bad in (("has_bias", True), ("has_gate", False), ("is_transposed", True),
                      ("is_concatenated", False), ("has_post_expert_norm", True)):
        if getattr(mod, flag, not bad) == bad:
            return f"{type(mod).__name__} has {flag}={bad}; NVFP4 experts run gated, concatenated, untransposed experts"
    e, n2, h = mod.gate_up_proj.shape
    if tuple(mod.down_proj.shape) != (e, h, n2 // 2) or n2 % 2:
        return (f"expert shapes gate_up_proj {tuple(mod.gate_up_proj.shape)} / down_proj "
                f"{tuple(mod.down_proj.shape)} are not [E, 2I, H] / [E, H, I]")
    return shape_problem(h, n2 // 2)


def shape_problem(hidden: int, inter: int) -> str | None:
    """The kernels' rules for both expert GEMMs: K % 32 == 0 (H for gate_up, I for down), N % 8 == 0."""
    for what, k in (("hidden size H (gate_up's K)", hidden), ("intermediate size I (down's K)", inter)):
        if k <= 0 or k % 32:
            return f"the {what} must be a positive multiple of 32, got {k}"
    return None


# ---------------------------------------------------------------------------------------------------------
# The module


class NVFP4Experts(nn.Module):
    """Routed experts in NVFP4 (module docstring): a drop-in for transformers' experts modules."""

    # Under nvfp4_gemm.parallel.ExpertParallel, forward returns its float32 per-token sums (not rounded to the
    # input's dtype): the ranks' partial sums are all-reduced in float32 and rounded once, as one process does.
    expert_parallel_float32_output = True

    def __init__(self, num_experts: int, hidden_dim: int, intermediate_dim: int, *, act_fn: nn.Module | None = None,
                 weight_only: bool = False, static_input_scale: bool = False,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        why = shape_problem(hidden_dim, intermediate_dim)
        if why:
            raise ValueError(f"NVFP4Experts: {why}")
        if num_experts <= 0:
            raise ValueError(f"NVFP4Experts: num_experts must be positive, got {num_experts}")
        if weight_only and static_input_scale:
            raise ValueError("NVFP4Experts: weight_only experts have no input scale; static_input_scale must be False")
        e, h, i = num_experts, hidden_dim, intermediate_dim
        self.num_experts, self.hidden_dim, self.intermediate_dim = e, h, i
        self.weight_only = bool(weight_only)
        self.act_fn = act_fn if act_fn is not None else nn.SiLU()
        s1, s2 = blocked_shape(2 * i, h), blocked_shape(h, i)
        self.register_buffer("gate_up_proj", torch.zeros(e, 2 * i, h // 2, dtype=torch.uint8, device=device))
        self.register_buffer("gate_up_proj_weight_scale",
                             torch.zeros(e, s1[0] * s1[1], dtype=torch.float8_e4m3fn, device=device))
        self.register_buffer("gate_up_proj_weight_scale_2", torch.ones(e, 2, dtype=torch.float32, device=device))
        self.register_buffer("gate_up_proj_input_scale",
                             torch.ones(e, 2, dtype=torch.float32, device=device) if static_input_scale else None)
        self.register_buffer("down_proj", torch.zeros(e, h, i // 2, dtype=torch.uint8, device=device))
        self.register_buffer("down_proj_weight_scale",
                             torch.zeros(e, s2[0] * s2[1], dtype=torch.float8_e4m3fn, device=device))
        self.register_buffer("down_proj_weight_scale_2", torch.ones(e, dtype=torch.float32, device=device))
        self.register_buffer("down_proj_input_scale",
                             torch.ones(e, dtype=torch.float32, device=device) if static_input_scale else None)
        self._plan: dict | None = None
        self.register_load_state_dict_post_hook(_refresh_after_load)

    # -- the host-side plan: which recipe each GEMM runs (read from the scales once, never in forward)

    @property
    def static_input_scale(self) -> bool:
        return self.gate_up_proj_input_scale is not None

    def refresh(self) -> None:
        """Re-reads the per-tensor scales into the plan forward follows (a host sync). Called after
        construction by the builders and after load_state_dict; call it after changing a scale in place."""
        ws2 = self.gate_up_proj_weight_scale_2
        inp = self.gate_up_proj_input_scale
        dinp = self.down_proj_input_scale
        if any(t is not None and t.is_meta for t in (ws2, inp, dinp)):
            self._plan = None
            return
        parts_differ = not torch.equal(ws2[:, 0], ws2[:, 1])
        inputs_differ = inp is not None and not torch.equal(inp[:, 0], inp[:, 1])
        self._plan = {
            # gate and up run with their own alphas (fp32 GEMM, per-part columns) where anything differs
            "own_alphas": parts_differ or inputs_differ,
            "split_inputs": inputs_differ,
            # one input scale for every expert: quantize the T tokens once, gather packed rows
            "gate_up_uniform": inp is None or bool((inp == inp[0, 0]).all()),
            "down_uniform": dinp is None or bool((dinp == dinp[0]).all()),
        }

    def plan(self) -> dict:
        if self._plan is None:
            self.refresh()
        if self._plan is None:
            raise RuntimeError("NVFP4Experts: the scales are on the meta device (load them first)")
        return self._plan

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # As NVFP4Linear: a saved static module loads into a fresh dynamic one (the checkpoint decides the mode).
        if prefix + "gate_up_proj_input_scale" in state_dict and self.gate_up_proj_input_scale is None \
                and not self.weight_only:
            dev = self.gate_up_proj.device
            self.gate_up_proj_input_scale = torch.ones(self.num_experts, 2, dtype=torch.float32, device=dev)
            self.down_proj_input_scale = torch.ones(self.num_experts, dtype=torch.float32, device=dev)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _apply(self, fn, recurse=True):
        # Casts (.half(), .to(dtype)) leave the format buffers as they are; device moves move them.
        for name, t in list(self._buffers.items()):
            if t is None:
                continue
            probe = fn(t.new_empty(0))
            self._buffers[name] = fn(t) if probe.dtype == t.dtype else t.to(probe.device)
        for m in self.children():
            m._apply(fn, recurse)
        return self

    def extra_repr(self) -> str:
        mode = "weight_only" if self.weight_only else "static" if self.static_input_scale else "dynamic"
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
                f"intermediate_dim={self.intermediate_dim}, mode={mode}")

    # -- building

    @classmethod
    def from_float(cls, experts: nn.Module, *, weight_only: bool = False, method: str = "rtn",
                   share_gate_up: bool = True, stats: "ExpertStats | None" = None) -> "NVFP4Experts":
        """Quantizes a transformers experts module on its device, expert by expert (method: rtn / mse / gptq,
        nvfp4_gemm.methods.quantize_weight). share_gate_up: gate and up of an expert get one per-tensor scale
        (the method's choice over the [2I, H] matrix), else each its own. stats: calibration of this module
        (ExpertStats): static input scales from its amaxes (unless weight_only), the Hessians / their
        diagonals for gptq / mse; experts the calibration never routed a token to keep dynamic-free defaults:
        their amax is 0, so their static input scale is the smallest one (they have no inputs to fit)."""
        check_method(method)

        def _quantize_weight(w, m, hessian):
            return methods.quantize_weight(w, m, **({} if hessian is None else {"hessian": hessian}))

        why = unsupported_reason(experts)
        if why:
            raise ValueError(f"NVFP4Experts.from_float: {why}")
        gu, dn = experts.gate_up_proj.detach(), experts.down_proj.detach()
        e, n2, h = gu.shape
        i = n2 // 2
        static = stats is not None and stats.amax_in is not None and not weight_only
        if method == "gptq" and (stats is None or stats.hessian_in is None):
            raise ValueError("NVFP4Experts.from_float: method='gptq' needs stats with Hessians (calibration)")
        out = cls(e, h, i, act_fn=getattr(experts, "act_fn", None), weight_only=weight_only,
                  static_input_scale=static, device=gu.device)

        def hess(which, idx):
            if stats is None:
                return None
            src = stats.hessian_in if which == "in" else stats.hessian_mid
            if src is None or stats.rows[idx] == 0:
                if method == "gptq":  # an expert nothing was routed to: no inputs to fit, rounding to nearest
                    return "rtn"
                return None
            return src[idx]

        with torch.no_grad():
            for x in range(e):
                h_in = hess("in", x)
                m_in = "rtn" if isinstance(h_in, str) else method
                h_in = None if isinstance(h_in, str) else h_in
                if share_gate_up:
                    packed, sf, ws2 = _quantize_weight(gu[x] if gu.dtype in _FLOATS else gu[x].float(), m_in, h_in)
                    out.gate_up_proj[x].copy_(packed)
                    out.gate_up_proj_weight_scale[x].copy_(sf.reshape(-1))
                    out.gate_up_proj_weight_scale_2[x].copy_(ws2.reshape(1).expand(2))
                else:
                    lin = []
                    for p in range(2):
                        packed, sf, ws2 = _quantize_weight(
                            gu[x, p * i:(p + 1) * i] if gu.dtype in _FLOATS else gu[x, p * i:(p + 1) * i].float(),
                            m_in, h_in)
                        out.gate_up_proj[x, p * i:(p + 1) * i].copy_(packed)
                        out.gate_up_proj_weight_scale_2[x, p].copy_(ws2.reshape(()))
                        lin.append(from_blocked(sf, i, h))
                    out.gate_up_proj_weight_scale[x].copy_(to_blocked(torch.cat(lin)))
                h_mid = hess("mid", x)
                m_mid = "rtn" if isinstance(h_mid, str) else method
                h_mid = None if isinstance(h_mid, str) else h_mid
                packed, sf, ws2 = _quantize_weight(dn[x] if dn.dtype in _FLOATS else dn[x].float(), m_mid, h_mid)
                out.down_proj[x].copy_(packed)
                out.down_proj_weight_scale[x].copy_(sf.reshape(-1))
                out.down_proj_weight_scale_2[x].copy_(ws2.reshape(()))
            if static:
                # input decode scale = amax / 2688 (NVFP4Linear.set_input_amax), gate and up share the input
                dec_in = 1.0 / global_encode_scale_rows(stats.amax_in)
                dec_mid = 1.0 / global_encode_scale_rows(stats.amax_mid)
                out.gate_up_proj_input_scale.copy_(dec_in.unsqueeze(1).expand(e, 2))
                out.down_proj_input_scale.copy_(dec_mid)
        out.refresh()
        return out

    # -- forward

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return experts_forward(self, hidden_states, top_k_index, top_k_weights)


def _refresh_after_load(module: "NVFP4Experts", incompatible_keys) -> None:
    # (a module-level function, not a lambda: the hook is pickled with the module by torch.save)
    module.refresh()


def global_encode_scale_rows(amax: torch.Tensor) -> torch.Tensor:
    """global_encode_scale elementwise: 2688 / amax, 1 where amax = 0, clamped to the largest float32."""
    amax = amax.to(torch.float32)
    gs = (E2M1_MAX * E4M3_MAX) / amax
    gs = torch.where(amax > 0, gs, torch.ones_like(gs))
    return torch.clamp(gs, max=torch.finfo(torch.float32).max)


# ---------------------------------------------------------------------------------------------------------
# The grouped GEMMs and the quantization of their A


_GROUPED_MM = torch.ops.nvfp4_gemm.grouped_mm.default
_GROUPED_LINEAR = torch.ops.nvfp4_gemm._grouped_linear.default
# gate_up with one input scale for all experts (dynamic, or one static scale): up to this many gathered rows
# (T x top-k) the fused op quantizes the gathered copy; past it the T tokens are quantized once and the packed rows
# gathered
_FUSED_SHARED_ROWS = 512


def _grouped_mm(a, b, sfa, sfb, offs, alpha, out_dtype):
    return _GROUPED_MM(a, b, sfa, sfb, offs, alpha, out_dtype)


_MOE_ROUTE = torch.ops.nvfp4_gemm._moe_route.default
_MOE_ROUTE_MAX_EXPERTS = 4096  # csrc/bindings/moe_route.h kMoeRouteMaxExperts


@torch.library.register_fake("nvfp4_gemm::_moe_route")
def _moe_route_fake(top_k_index, num_experts):
    op = "nvfp4_gemm._moe_route"
    torch._check(top_k_index.dim() == 2,
                 lambda: f"{op}: top_k_index must be 2-D [T, k], got shape {tuple(top_k_index.shape)}")
    torch._check(top_k_index.dtype in (torch.int64, torch.int32),
                 lambda: f"{op}: top_k_index must be int64 or int32 expert ids, got {top_k_index.dtype}")
    torch._check(1 <= num_experts <= _MOE_ROUTE_MAX_EXPERTS,
                 lambda: f"{op}: num_experts must be in [1, {_MOE_ROUTE_MAX_EXPERTS}], got {num_experts}")
    s = top_k_index.shape[0] * top_k_index.shape[1]
    return (top_k_index.new_empty((num_experts,), dtype=torch.int32),
            top_k_index.new_empty((s,), dtype=torch.int64), top_k_index.new_empty((s,), dtype=torch.int64))


def moe_route(top_k_index: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The routing of the T x k (token, slot) pairs, pair p = t * k + slot, on top_k_index's device without a host
    sync (one kernel on CUDA for T * k <= 8192): (offs int32 [E], row_token int64 [S], inverse int64 [S]),
    S = T * k. The pairs sorted by expert id, stably (ascending p within an expert: torch.sort(ids, stable=True)'s
    order); offs[e] = the rows of experts 0..e (grouped_mm's offs), row_token[r] = the token of sorted row r,
    inverse[p] = the sorted row of pair p. An id outside [0, E) (transformers' expert-parallel sentinel E) is in
    no expert: those pairs take the last rows, in pair order (for the id E alone, torch.sort's order too), and
    offs[E-1] = S counts them into the last expert's group, so every row belongs to a group (grouped_mm's rule);
    row_token / inverse cover them, and the caller drops their results."""
    return _MOE_ROUTE(top_k_index, num_experts)


_MOE_TOPK = torch.ops.nvfp4_gemm._moe_topk.default
_MOE_TOPK_MAX_EXPERTS, _MOE_TOPK_MAX_K = 512, 32  # csrc/bindings/moe_topk.h kMoeTopkMaxExperts, kMoeTopkMaxK


@torch.library.register_fake("nvfp4_gemm::_moe_topk")
def _moe_topk_fake(logits, k, normalize):
    op = "nvfp4_gemm._moe_topk"
    torch._check(logits.dim() == 2,
                 lambda: f"{op}: logits must be 2-D [T, E] (tokens x experts), got shape {tuple(logits.shape)}")
    torch._check(logits.dtype in _FLOATS,
                 lambda: f"{op}: logits must be float32, float16 or bfloat16, got {logits.dtype}")
    e = logits.shape[1]
    torch._check(1 <= e <= _MOE_TOPK_MAX_EXPERTS,
                 lambda: f"{op}: logits must have 1 to {_MOE_TOPK_MAX_EXPERTS} experts (E = logits.size(1)), got {e}")
    torch._check(1 <= k and k <= e and k <= _MOE_TOPK_MAX_K,
                 lambda: f"{op}: k must be in [1, min(E, {_MOE_TOPK_MAX_K})], got {k} (E = {e})")
    t = logits.shape[0]
    return logits.new_empty((t, k)), logits.new_empty((t, k), dtype=torch.int64)


def _moe_topk_setup_context(ctx, inputs, output):
    logits, _, normalize = inputs
    ctx.normalize = normalize
    ctx.save_for_backward(logits, output[1])


def _moe_topk_backward(ctx, grad_weights, _grad_ids):
    # transformers' formula differentiated (the router's weight trains through the top-k weights as before): the
    # cast, the renormalization w = v / sum(v), the gather of the selected p, the softmax; the selection itself is
    # piecewise constant. The p are recomputed: saving [T, E] float32 for a rare backward is not worth it.
    logits, ids = ctx.saved_tensors
    p = torch.softmax(logits, dim=-1, dtype=torch.float32)
    g = grad_weights.float()
    if ctx.normalize:
        v = p.gather(-1, ids)
        s = v.sum(-1, keepdim=True)
        g = (g - (g * v).sum(-1, keepdim=True) / s) / s
    gp = torch.zeros_like(p).scatter_(-1, ids, g)
    return (p * (gp - (gp * p).sum(-1, keepdim=True))).to(logits.dtype), None, None


torch.library.register_autograd("nvfp4_gemm::_moe_topk", _moe_topk_backward, setup_context=_moe_topk_setup_context)


def moe_topk(logits: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A softmax top-k router's selection from its logits [T, E] (float32 / float16 / bfloat16, E <= 512,
    k <= min(E, 32)) on their device without a host sync (one kernel on CUDA): (weights [T, k] in logits' dtype,
    ids [T, k] int64). softmax in float32, the k largest probabilities in descending order (equal ones: the lower
    expert id first), divided by their float32 sum where normalize, rounded to logits' dtype: transformers'
    Qwen3-MoE / Qwen2-MoE / Mixtral router after its F.linear, to a few float32 ulps (csrc/bindings/moe_topk.h)."""
    return _MOE_TOPK(logits, k, normalize)


class _Routing:
    """The (token, expert) pairs sorted by expert (stable: token order within an expert), the token of each
    sorted row, the sorted row of each pair and the per-expert row ends (offs) the grouped GEMM reads on the
    device: one _moe_route call (moe_route). Pairs whose id lies outside [0, E) (transformers' expert-parallel
    sentinel) sit in the last expert's group, computed and then dropped by the combine (`valid`)."""

    def __init__(self, top_k_index: torch.Tensor, num_experts: int) -> None:
        self.k = top_k_index.shape[-1]
        self.s = top_k_index.numel()
        self.num_experts = num_experts
        self._ids = top_k_index
        self.offs, self.token, self.inverse = _MOE_ROUTE(top_k_index.reshape(-1, self.k), num_experts)

    @property
    def expert(self) -> torch.Tensor:
        """The expert id of each sorted row (top_k_index's dtype, [S]), formed on each access (one scatter)
        for the paths that need it: gate and up with their own alphas, calibration."""
        ids = self._ids.reshape(-1)
        ids = torch.where((ids >= 0) & (ids < self.num_experts), ids, self.num_experts - 1)  # their group's
        return torch.empty_like(ids).scatter_(0, self.inverse, ids)


def _quantized_a(x: torch.Tensor, routing: _Routing, gather: torch.Tensor | None, uniform: bool,
                 input_scale: torch.Tensor | None, ws2: torch.Tensor | None = None):
    """A of one grouped GEMM in NVFP4: (packed [S, K/2], grouped blocked sfa, scale), scale the input DECODE
    scale (one [1] or per expert [E]), or with ws2 (the experts' weight_scale_2 [E]) the GEMM's alpha
    fl(decode * ws2) [E]. x: the tensor the rows come from ([T, K] with gather = the token of each sorted row, or
    the [S, K] sorted rows with gather None). input_scale: the experts' static DECODE scales [E], or None
    (dynamic: one scale from the finite amax of x)."""
    k = x.shape[1]
    if input_scale is None or uniform:
        # one encode scale for every row, formed as nvfp4_gemm.linear forms it (dynamic: 2688 / amax; static:
        # 1 / input_scale): quantize the rows x has (the T tokens, not their k gathered copies), then gather
        if input_scale is None:
            encode = global_encode_scale(finite_amax(x))
            decode = torch.reciprocal(encode)
        else:
            decode = input_scale[:1].float()
            encode = torch.reciprocal(decode)
        packed, sf = quantize(x.contiguous(), encode)
        sf_lin = from_blocked(sf, x.shape[0], k)
        if gather is not None:
            packed, sf_lin = packed[gather], sf_lin[gather]
        return packed, to_blocked_grouped(sf_lin, routing.offs), decode if ws2 is None else decode * ws2
    rows = x if gather is None else x[gather]
    # per expert: the kernel forms fl(decode * ws2) itself (no multiply launched behind it)
    return quantize_grouped(rows.contiguous(), routing.offs, input_scale.float().contiguous(), weight_scale_2=ws2)


def _gemm(mod: NVFP4Experts, which: str, x: torch.Tensor, routing: _Routing, gather, out_dtype,
          part: int | None = None) -> torch.Tensor:
    """One grouped GEMM of the experts' `which` weights ('gate_up_proj' / 'down_proj') on the sorted rows.
    part None: alpha of each expert applied in the GEMM, result in out_dtype. part p: gate_up with part p's
    input scale, no alpha, float32 (the caller applies the per-part alphas)."""
    b = mod._buffers[which]
    sfb = mod._buffers[which + "_weight_scale"]
    ws2 = mod._buffers[which + "_weight_scale_2"]
    inp = mod._buffers[which + "_input_scale"]
    plan = mod.plan()
    if which == "gate_up_proj":
        ws2 = ws2[:, 0].contiguous()  # (the gate's: gate and up share it on this path)
        if inp is not None:
            inp = inp[:, 0 if part is None else part]
        uniform = plan["gate_up_uniform"]
    else:
        uniform = plan["down_uniform"]
    if mod.weight_only:
        a = x if gather is None else x[gather]
        alpha = None if part is not None else ws2
        return _grouped_mm(a, b, None, sfb, routing.offs, alpha, out_dtype if part is None else torch.float32)
    if part is not None:
        packed, sfa, decode = _quantized_a(x, routing, gather, uniform, inp)
        return _grouped_mm(packed, b, sfa, sfb, routing.offs, None, torch.float32), decode
    if not uniform or gather is None or gather.numel() <= _FUSED_SHARED_ROWS:
        # quantize_grouped + grouped_mm in one op (the GEMM streams its weights while A is quantized): per-expert
        # static scales, or one scale for all experts (static, or dynamic from all the op's input rows, which hold
        # every token). One scale gives the same bits quantized once and gathered; that pays only where the gathered
        # rows are many (gate_up past _FUSED_SHARED_ROWS), since it launches a quantize, a gather and a scale
        # re-layout before the GEMM
        rows = x if gather is None else x[gather]
        scale = None if inp is None else inp.float().contiguous()
        return _GROUPED_LINEAR(rows.contiguous(), b, sfb, routing.offs, scale, ws2.float().contiguous(), out_dtype,
                               inp is None)
    # alpha = fl(input decode * weight_scale_2) per expert, as linear forms it
    packed, sfa, alpha = _quantized_a(x, routing, gather, uniform, inp, ws2.float().contiguous())
    return _grouped_mm(packed, b, sfa, sfb, routing.offs, alpha, out_dtype)


def _gate_up_own_alphas(mod: NVFP4Experts, x: torch.Tensor, routing: _Routing) -> torch.Tensor:
    """gate_up where gate and up of an expert differ in a per-tensor scale: each part's columns get that
    part's own alpha (fl(input decode * its weight_scale_2), or its weight_scale_2 weight-only) on the float32
    GEMM result, then one rounding to x's dtype."""
    i = mod.intermediate_dim
    expert = routing.expert
    ws2 = mod.gate_up_proj_weight_scale_2.float()[expert]  # [S, 2]
    if mod.weight_only:
        acc = _gemm(mod, "gate_up_proj", x, routing, routing.token, torch.float32, part=0)
        alpha = ws2
    else:
        parts = [0, 1] if mod.plan()["split_inputs"] else [0]
        accs, decodes = [], []
        for p in parts:
            acc_p, dec = _gemm(mod, "gate_up_proj", x, routing, routing.token, torch.float32, part=p)
            accs.append(acc_p)
            decodes.append(dec[expert].reshape(-1, 1) if dec.numel() > 1 else dec.reshape(1, 1))
        if len(parts) == 2:  # each part's columns from the GEMM whose A was quantized with that part's scale
            acc = torch.cat([accs[0][:, :i], accs[1][:, i:]], dim=1)
            decode = torch.cat([decodes[0].expand(acc.shape[0], 1), decodes[1].expand(acc.shape[0], 1)], dim=1)
        else:
            acc, decode = accs[0], decodes[0]
        alpha = decode * ws2  # [S, 2]
    alpha_cols = alpha.repeat_interleave(i, dim=1)
    return torch.mul(acc, alpha_cols).to(x.dtype)


def experts_forward(mod: NVFP4Experts, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts' computation (module docstring); hidden_states [T, H], top_k_index / top_k_weights [T, k]."""
    t, h = hidden_states.shape
    if h != mod.hidden_dim:
        raise ValueError(f"NVFP4Experts: hidden_states must be [T, {mod.hidden_dim}], got {tuple(hidden_states.shape)}")
    if hidden_states.dtype not in _FLOATS:
        raise ValueError(f"NVFP4Experts: hidden_states must be float16, bfloat16 or float32, got {hidden_states.dtype}")
    if top_k_index.shape != top_k_weights.shape or top_k_index.dim() != 2 or top_k_index.shape[0] != t:
        raise ValueError(f"NVFP4Experts: top_k_index and top_k_weights must both be [T={t}, k], got "
                         f"{tuple(top_k_index.shape)} and {tuple(top_k_weights.shape)}")
    dtype = hidden_states.dtype
    if t == 0:
        return hidden_states.new_zeros(0, h)
    routing = _Routing(top_k_index, mod.num_experts)
    x = hidden_states if hidden_states.is_contiguous() else hidden_states.contiguous()
    i = mod.intermediate_dim
    if mod.plan()["own_alphas"]:
        gate_up = _gate_up_own_alphas(mod, x, routing)
    else:
        gate_up = _gemm(mod, "gate_up_proj", x, routing, routing.token, dtype)
    inter = mod.act_fn(gate_up[:, :i]) * gate_up[:, i:]
    observer = mod.__dict__.get("_observer")
    if observer is not None:  # calibration (calibrate_static): sees both GEMMs' inputs
        observer(routing, x, inter)
    down = _gemm(mod, "down_proj", inter, routing, None, dtype)
    # back to (token, slot) order by a gather (one pass, no zero fill; inductor fuses it with what follows),
    # the top-k weight in fp32, the k slots of a token summed in fp32 (deterministic: no atomics), one rounding
    y = down[routing.inverse].to(torch.float32).view(t, routing.k, h) * top_k_weights.to(torch.float32).unsqueeze(-1)
    # a pair whose id is outside [0, E) (the expert-parallel sentinel) was computed in the last expert's group:
    # dropped here, as transformers' experts skip it (inductor fuses this into the gather)
    valid = (top_k_index >= 0) & (top_k_index < mod.num_experts)
    y = torch.where(valid.unsqueeze(-1), y, 0.0).sum(dim=1)
    return y if mod.__dict__.get("_ep_float32_output", False) else y.to(dtype)


# ---------------------------------------------------------------------------------------------------------
# The router: its softmax / top-k / renormalization / cast in one op

# transformers' softmax top-k routers whose forward was read (transformers 5.23) -> (model package, the attribute
# saying whether the top-k weights are renormalized (None: always), whether the weights are cast back to the
# logits' dtype). Each forward is: logits = F.linear(hidden_states.reshape(-1, hidden_dim), weight),
# p = softmax(float32(logits)), (w, ids) = topk(p, top_k), [w /= w.sum(-1)], [w = w.to(logits.dtype)], and it
# returns (logits, w, ids). Mixtral always renormalizes and keeps w in float32.
_ROUTERS = {
    "Qwen3MoeTopKRouter": ("qwen3_moe", "norm_topk_prob", True),
    "Qwen2MoeTopKRouter": ("qwen2_moe", "norm_topk_prob", True),
    "MixtralTopKRouter": ("mixtral", None, False),
}
_ROUTER_PREFIX = "FusedTopK"
_ROUTER_SUBCLASSES: dict[type, type] = {}
_ROUTER_PROBES: dict[tuple[type, bool], str | None] = {}


class _FusedTopKForward:
    """The forward of a fused-top-k router (the base of the classes _router_subclass makes): transformers' logits
    GEMM, then _moe_topk for the softmax, top-k, renormalization and cast (one kernel on CUDA instead of torch's
    two top-k kernels and the softmax / normalize ones). The same outputs (logits, weights, ids), equal probabilities
    ordered by the lower expert id. Logits of a dtype the op does not take run transformers' own forward."""

    _normalize_attr: str | None = None
    _cast: bool = True

    def forward(self, hidden_states: torch.Tensor):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        if hidden_states.dtype not in _FLOATS or self.weight.dtype not in _FLOATS:
            return super().forward(hidden_states)  # before the GEMM, so it runs once
        router_logits = nn.functional.linear(hidden_states, self.weight)
        normalize = True if self._normalize_attr is None else bool(getattr(self, self._normalize_attr))
        weights, ids = _MOE_TOPK(router_logits if self._cast else router_logits.float(), self.top_k, normalize)
        return router_logits, weights, ids


def _router_subclass(cls: type) -> type:
    """The fused-top-k subclass of a router class of _ROUTERS: isinstance(router, cls) still holds (transformers
    records router_logits and initializes weights by isinstance), named in this module for pickle (__getattr__)."""
    sub = _ROUTER_SUBCLASSES.get(cls)
    if sub is None:
        _, norm, cast = _ROUTERS[cls.__name__]
        name = _ROUTER_PREFIX + cls.__name__
        sub = type(name, (_FusedTopKForward, cls), {
            "__module__": __name__, "__qualname__": name, "_normalize_attr": norm, "_cast": cast,
            "__doc__": f"transformers' {cls.__name__} with its top-k in one op (nvfp4_gemm.moe._FusedTopKForward)."})
        _ROUTER_SUBCLASSES[cls] = sub
    return sub


def __getattr__(name: str):
    # torch.save of a whole model pickles a fused router by its class's name: unpickling (in a fresh process too)
    # looks it up here
    base = name[len(_ROUTER_PREFIX):] if name.startswith(_ROUTER_PREFIX) else None
    if base in _ROUTERS:
        import importlib

        pkg = _ROUTERS[base][0]
        return _router_subclass(getattr(importlib.import_module(f"transformers.models.{pkg}.modeling_{pkg}"), base))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _probe_router(cls: type, normalize: bool) -> str | None:
    """None if cls.forward computes what _FusedTopKForward does (once per class and flag, on a 16-token CPU
    probe whose logits are distinct multiples of 1/8, so no ties), else what differed: a transformers release that
    changes a router's forward leaves that router alone instead of routing differently."""
    key = (cls, normalize)
    if key not in _ROUTER_PROBES:
        sub = _router_subclass(cls)
        e, h, k = 12, 16, 3
        probe = sub.__new__(sub)
        nn.Module.__init__(probe)
        probe.top_k, probe.num_experts, probe.hidden_dim = k, e, h
        if sub._normalize_attr is not None:
            setattr(probe, sub._normalize_attr, normalize)
        g = torch.Generator().manual_seed(0)
        # one-hot hidden states: token t's logits are the weight's column t, exactly
        probe.weight = nn.Parameter((torch.randperm(e * h, generator=g).reshape(e, h).float() - e * h / 2) / 8,
                                    requires_grad=False)
        x = torch.eye(h)
        why = None
        try:
            with torch.no_grad():
                want, got = cls.forward(probe, x), probe(x)
            if not (isinstance(want, tuple) and len(want) == 3):
                why = "its forward does not return (logits, weights, ids)"
            elif not torch.equal(want[0], got[0]) or not torch.equal(want[2], got[2]):
                why = "its forward selects other experts than softmax + top-k"
            elif want[1].dtype != got[1].dtype or not torch.allclose(want[1], got[1], rtol=1e-5, atol=0):
                why = "its forward weighs the experts otherwise than softmax + top-k + renormalization"
        except Exception as exc:  # noqa: BLE001 - any failure on the probe means the forward is not the one read
            why = f"its forward fails on a probe ({type(exc).__name__}: {exc})"
        _ROUTER_PROBES[key] = why
    return _ROUTER_PROBES[key]


def router_problem(mod: nn.Module) -> str | None:
    """None if the router `mod` can take the fused top-k (fuse_routers), else why not."""
    cls = type(mod)
    spec = _ROUTERS.get(cls.__name__)
    if spec is None or family_of(mod) != spec[0]:
        return f"{cls.__name__} ({cls.__module__}) is not one of the softmax top-k routers read ({', '.join(_ROUTERS)})"
    if "forward" in mod.__dict__:
        return "its forward is replaced on the instance"
    w = getattr(mod, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or getattr(mod, "hidden_dim", None) != w.shape[1]:
        return "its weight is not a 2-D [E, hidden_dim] tensor"
    e, k = w.shape[0], getattr(mod, "top_k", None)
    if not 1 <= e <= _MOE_TOPK_MAX_EXPERTS:
        return f"it has {e} experts; the op takes 1 to {_MOE_TOPK_MAX_EXPERTS}"
    if not isinstance(k, int) or not 1 <= k <= min(e, _MOE_TOPK_MAX_K):
        return f"its top_k {k!r} is not in [1, min(E, {_MOE_TOPK_MAX_K})]"
    normalize = True
    if spec[1] is not None:
        normalize = getattr(mod, spec[1], None)
        if not isinstance(normalize, bool):
            return f"its {spec[1]} is not a bool"
    return _probe_router(cls, normalize)


def router_of(model: nn.Module, experts_name: str) -> tuple[str, nn.Module | None]:
    """The router beside the experts module `experts_name` (its MoE block's 'gate'): (its name, the module or None
    where the block has none)."""
    block = experts_name.rpartition(".")[0]
    gate = f"{block}.gate" if block else "gate"
    try:
        return gate, model.get_submodule(gate)
    except AttributeError:
        return gate, None


def fuse_routers(model: nn.Module, experts_names: list[str]) -> list[str]:
    """Gives the router (the 'gate' beside each experts module of `experts_names`) the fused top-k forward, in
    place, where router_problem accepts it: the module keeps its parameter, attributes, hooks and state_dict keys;
    only its class becomes the fused subclass of its own. Other routers are left as they are. Returns the names of
    the routers fused (already fused ones included)."""
    out = []
    for name in experts_names:
        gate, router = router_of(model, name)
        if router is None:
            continue
        if not isinstance(router, _FusedTopKForward):
            why = router_problem(router)
            if why is not None:
                log.debug("router '%s' keeps its own forward: %s", gate, why)
                continue
            router.__class__ = _router_subclass(type(router))
        out.append(gate)
    return out


# ---------------------------------------------------------------------------------------------------------
# Calibration and quantize_model's part


class ExpertStats:
    """What calibration saw of one experts module, per expert: rows routed, finite amax of the gate_up input
    (the routed tokens) and of the down input (SiLU(gate) * up of the float weights), and optionally their
    Hessians (HessianAccumulator, gptq: full; mse: diagonal)."""

    def __init__(self, experts: nn.Module, hessians: str | None) -> None:
        e, n2, h = experts.gate_up_proj.shape
        dev = experts.gate_up_proj.device
        self.rows = [0] * e
        self.amax_in = torch.zeros(e, dtype=torch.float32, device=dev)
        self.amax_mid = torch.zeros(e, dtype=torch.float32, device=dev)
        self.hessian_in = self.hessian_mid = None
        self._acc_in = self._acc_mid = None
        if hessians is not None:
            acc = methods.HessianAccumulator
            diag = hessians == "diagonal"
            self._acc_in = [acc(h, dev, diagonal=diag) for _ in range(e)]
            self._acc_mid = [acc(n2 // 2, dev, diagonal=diag) for _ in range(e)]

    def record(self, experts: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor) -> None:
        i = experts.gate_up_proj.shape[1] // 2
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        idx = top_k_index.reshape(x.shape[0], -1)
        hit = torch.unique(idx).tolist()  # host sync: calibration runs eagerly
        for e in hit:
            if not 0 <= e < len(self.rows):
                continue
            rows = x[(idx == e).any(dim=1)]
            self.rows[e] += rows.shape[0]
            self.amax_in[e] = torch.maximum(self.amax_in[e], finite_amax(rows))
            gu = nn.functional.linear(rows, experts.gate_up_proj[e].to(rows.dtype))
            mid = experts.act_fn(gu[:, :i]) * gu[:, i:]
            self.amax_mid[e] = torch.maximum(self.amax_mid[e], finite_amax(mid))
            if self._acc_in is not None:
                self._acc_in[e].add(rows.detach())
                self._acc_mid[e].add(mid.detach())

    def finish(self) -> None:
        if self._acc_in is not None:
            self.hessian_in = [a.hessian() if r else None for a, r in zip(self._acc_in, self.rows)]
            self.hessian_mid = [a.hessian() if r else None for a, r in zip(self._acc_mid, self.rows)]
            self._acc_in = self._acc_mid = None


def _calibrate_experts(model: nn.Module, names: list[str], calibrate, hessians: str | None) -> dict[str, ExpertStats]:
    stats = {n: ExpertStats(model.get_submodule(n), hessians) for n in names}

    def hook(name):
        def pre(mod, args, kwargs):
            hs = args[0] if args else kwargs["hidden_states"]
            idx = args[1] if len(args) > 1 else kwargs["top_k_index"]
            stats[name].record(mod, hs, idx)
        return pre

    handles = [model.get_submodule(n).register_forward_pre_hook(hook(n), with_kwargs=True) for n in names]
    try:
        with torch.no_grad():
            calibrate(model)
    finally:
        for hd in handles:
            hd.remove()
    for s in stats.values():
        s.finish()
    return stats


def quantize_experts(model: nn.Module, filter=None, *, calibrate=None, weight_only: bool = False,
                     method: str = "rtn", share_gate_up: bool = True, progress: bool = False) -> list[str]:
    """Replaces, in place, every transformers experts module of `model` (that filter(name, module) accepts)
    by NVFP4Experts.from_float. calibrate(model): W4A4 experts get static per-expert input scales from the
    largest finite |input| each expert saw; mse weighs columns by the inputs' mean squares; gptq needs it (one
    calibrate pass per experts module, its Hessians only: sequential, as quantize_model's dense GPTQ).
    The routers beside the replaced modules take the fused top-k (fuse_routers; the same outputs). Returns the
    names replaced."""
    names = experts_to_quantize(model, filter)
    if method == "gptq" and calibrate is None:
        raise ValueError("quantize_experts: method='gptq' needs calibrate")
    want_static = calibrate is not None and not weight_only
    hess = {"gptq": "full", "mse": "diagonal"}.get(method) if calibrate is not None else None
    bar = None
    if progress and names:
        try:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(names), desc="quantize experts", unit="layer")
        except ImportError:
            bar = None

    def swap(name, stats):
        parent, _, attr = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        new = NVFP4Experts.from_float(getattr(owner, attr), weight_only=weight_only, method=method,
                                      share_gate_up=share_gate_up, stats=stats)
        setattr(owner, attr, new)
        if bar is not None:
            bar.update(1)

    try:
        if method == "gptq":
            for name in names:
                swap(name, _calibrate_experts(model, [name], calibrate, "full")[name])
        else:
            stats = _calibrate_experts(model, names, calibrate, hess) if (want_static or hess) else {}
            for name in names:
                s = stats.get(name)
                if s is not None and not want_static:
                    s.amax_in = None
                swap(name, s)
    finally:
        if bar is not None:
            bar.close()
    fuse_routers(model, names)
    return names


def _row_amax_per_expert(rows: torch.Tensor, expert: torch.Tensor, num_experts: int) -> torch.Tensor:
    a = rows.detach().abs().float()
    a = torch.where(torch.isfinite(a), a, torch.zeros_like(a)).amax(dim=1)
    out = torch.zeros(num_experts, dtype=torch.float32, device=rows.device)
    return out.scatter_reduce(0, expert, a, "amax")


def calibrate_static(model: nn.Module, names: list[str], calibrate) -> list[str]:
    """Runs calibrate(model) once (no_grad) and gives each W4A4 NVFP4Experts among `names` static input scales:
    per expert, the largest finite |input| its rows had (gate_up: the routed tokens; down: SiLU(gate) * up as
    the module computed it) / 2688. Experts that saw no token get the decode scale 1. Weight-only modules are
    left alone. Returns the names of the modules made static."""
    mods = {n: model.get_submodule(n) for n in names}
    mods = {n: m for n, m in mods.items() if isinstance(m, NVFP4Experts) and not m.weight_only}
    seen = {n: [torch.zeros(m.num_experts, device=m.gate_up_proj.device),
                torch.zeros(m.num_experts, device=m.gate_up_proj.device)] for n, m in mods.items()}

    def observer(name, m):
        def record(routing, x, inter):
            acc, expert = seen[name], routing.expert
            acc[0] = torch.maximum(acc[0], _row_amax_per_expert(x[routing.token], expert, m.num_experts))
            acc[1] = torch.maximum(acc[1], _row_amax_per_expert(inter, expert, m.num_experts))
        return record

    for n, m in mods.items():
        m.__dict__["_observer"] = observer(n, m)
    try:
        with torch.no_grad():
            calibrate(model)
    finally:
        for m in mods.values():
            m.__dict__.pop("_observer", None)
    for n, m in mods.items():
        a_in, a_mid = seen[n]
        dev = m.gate_up_proj.device
        m.gate_up_proj_input_scale = (1.0 / global_encode_scale_rows(a_in)).unsqueeze(1).expand(-1, 2).contiguous()
        m.down_proj_input_scale = (1.0 / global_encode_scale_rows(a_mid)).to(dev)
        m.refresh()
    return list(mods)


def experts_to_quantize(model: nn.Module, filter) -> list[str]:
    """quantize_model's plan: the experts modules filter(name, module) accepts (raises for those of unsupported
    families, before anything is quantized)."""
    names = []
    for name, mod in model.named_modules():
        if looks_like_experts(mod) and (filter is None or filter(name, mod)):
            why = unsupported_reason(mod)
            if why:
                raise NotImplementedError(f"'{name}': {why}; leave it out with filter= to keep it in float")
            names.append(name)
    return names


def quantize_model_experts(model: nn.Module, names: list[str], *, calibrate, weight_only: bool, method: str,
                           fuse: bool, progress: bool) -> list[str]:
    """quantize_model's part for experts modules `names` (experts_to_quantize): the same calibration, mode and
    method as its Linear layers; fuse shares gate's and up's per-tensor scale within each expert (as it shares
    the scale of a fused q/k/v or gate/up group)."""
    if not names:
        return []
    wanted = set(names)
    return quantize_experts(model, lambda n, m: n in wanted, calibrate=calibrate, weight_only=weight_only,
                            method=method, share_gate_up=fuse, progress=progress)
