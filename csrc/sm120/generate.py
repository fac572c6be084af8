#!/usr/bin/env python3
"""The SM120 / SM121 dispatch table: the one place where kernel configs and the rule choosing them live.

Renders, from TABLE below:
  csrc/sm120/generated/<name>.cu   one TU per config holding its fp16, bf16 and fp32 kernels (the output
                                   dtype is picked at run time; the CUTLASS front end, not the kernel,
                                   dominates a TU's compile time, as for sm100);
  csrc/sm120/generated/table.inc   the config list (names, parameters, selection rule) that select.cpp,
                                   api.cpp, nvfp4_gemm.configs() and the host tests use;
  csrc/sm120/generated/<grouped name>.cu, grouped_table.inc
                                   the same for the grouped (mixture-of-experts) configs of GROUPED_TABLE
                                   (grouped_gemm.cuh: CUTLASS's ptr-array grouped kernel), used by
                                   grouped_api.cpp and the host tests.
The rendered files are committed; tests/test_sm120_generated.py fails if they differ from a fresh render.

    python csrc/sm120/generate.py           # rewrite generated/
    python csrc/sm120/generate.py --check   # exit 1 if generated/ is stale

SM120 (RTX 50, RTX PRO 6000) and SM121 (DGX Spark GB10) run NVFP4 through a warp-level block-scaled MMA
(mma.sync ... kind::mxf4nvf4.block_scale, m16n8k64): no tcgen05, no TMEM, no multicast, so every cluster is
1x1x1 and the kernels are CUTLASS's Hopper-style TMA warp-specialized GEMMs with 99 KB of shared memory per
CTA. Hardware limits that shape the table: the scale-factor atom covers 128 rows, so a tile's M and N are
multiples of 128 (no 64-wide N side: swapping A and B buys nothing here, unlike sm100); the cooperative
schedule's 8 MMA warps tile M by 4 x 16 rows.

Selection: the first entry whose `m_max` >= M wins (the table is ordered by m_max); the last entry has no
bound. All entries use CUTLASS's default persistent tile scheduler (cluster-launch-control based on this
arch), the path CUTLASS's SM120 examples (79a/79b) take; stream-K on SM120 is left out because nothing in
CUTLASS 4.2's SM120 examples or our own runs exercises it, and these kernels have never run.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import generated_files  # noqa: E402  (csrc/generated_files.py)

OUT_DIR = os.path.join(HERE, "generated")

OUT_DTYPES = generated_files.OUT_DTYPES  # (file suffix, CUTLASS element, OutDtype enumerator)


@dataclass(frozen=True)
class Config:
    m_max: int | None     # chosen for M <= m_max (first match); None: no bound
    tile_m: int           # CTA tile rows (a multiple of 128: the scale-factor atom)
    tile_n: int
    tile_k: int           # 128 or 256 (two or four 64-deep MMAs per k-block)
    why: str

    @property
    def name(self) -> str:
        return f"sm120_nvfp4_{self.tile_m}x{self.tile_n}x{self.tile_k}"


TABLE = (
    # Decode and small batches (M <= 128 fills at most one 128-row tile). The op is bound by streaming B
    # (N*K/2 bytes); a 256-deep k-block halves the k-loop trips and barrier round trips per byte streamed.
    # smem/stage: A 16 KB + B 16 KB + SF 2 x 2 KB = 36 KB -> 2 stages, 84 KB with the epilogue (of 99 KB;
    # can_implement_test prints each entry's stages and bytes).
    Config(m_max=128, tile_m=128, tile_n=128, tile_k=256,
           why="M<=128 (decode): 128x128 tiles with 256-deep k-blocks, B streamed in 36 KB stages"),
    # Medium M: the tile of CUTLASS's SM120 NVFP4 example; 18 KB stages -> 4 stages, 84 KB.
    Config(m_max=256, tile_m=128, tile_n=128, tile_k=128,
           why="129<=M<=256: 128x128x128, 4 stages of 18 KB"),
    # Large M: 256 rows per CTA read B once per 256 rows (2x the flops per byte of B of 128x128).
    # smem/stage: A 16 KB + B 8 KB + SF 3 KB = 27 KB -> 3 stages, 93 KB.
    Config(m_max=None, tile_m=256, tile_n=128, tile_k=128,
           why="M>256: 256x128x128, B read once per 256 rows"),
)


@dataclass(frozen=True)
class GroupedConfig:
    rows_max: int | None  # chosen while ceil(T / G) <= rows_max (first match); None: no bound
    tile_m: int
    tile_n: int
    tile_k: int
    why: str

    @property
    def name(self) -> str:
        return f"sm120_nvfp4_grouped_{self.tile_m}x{self.tile_n}x{self.tile_k}"


# The grouped GEMM (nvfp4_gemm.grouped_mm): CUTLASS's ptr-array grouped block-scaled kernel (the collective of
# CUTLASS's example 79d, cooperative schedule), persistent over the SMs, with per-group problem shapes built on
# the device from offs. No swap (the scale-factor atom makes 128 the narrowest N here too), so a decode group of a
# few rows runs a 128-row tile as the dense decode entry does. One config: one TU, ~1.5 CPU-minutes to compile.
GROUPED_TABLE = (
    # The tile of CUTLASS's example 79d and of the dense 129..256 entry: 4 stages of 18 KB, 84 KB of 99 KB.
    GroupedConfig(rows_max=None, tile_m=128, tile_n=128, tile_k=128,
                  why="every grouped problem: 128x128x128 tiles, 4 stages of 18 KB"),
)


def _grouped_cu(cfg: GroupedConfig) -> str:
    return generated_files.kernel_tu("sm120", "GROUPED_TABLE", cfg.why, "grouped_gemm.cuh",
                                     f"GroupedKernelOps kGroupedOps_{cfg.name}", "grouped_ops_of", "GroupedKernel",
                                     f"{cfg.tile_m}, {cfg.tile_n}, {cfg.tile_k}")


def _grouped_table_inc() -> str:
    return generated_files.config_list(
        "sm120", "GROUPED_TABLE", "NVFP4_SM120_GROUPED_CONFIG", "name, rows_max (-1: none), tile_m, tile_n, tile_k",
        ["// One line per grouped config, in selection order (first rows_max >= ceil(T/G) wins). Define the macro,",
         "// then include."],
        [(c.name, generated_files.bound(c.rows_max), c.tile_m, c.tile_n, c.tile_k) for c in GROUPED_TABLE])


def _cu(cfg: Config) -> str:
    return generated_files.kernel_tu("sm120", "the table", cfg.why, "sm120_gemm.cuh", f"KernelOps kOps_{cfg.name}",
                                     "ops_of", "Kernel", f"{cfg.tile_m}, {cfg.tile_n}, {cfg.tile_k}")


def _table_inc() -> str:
    return generated_files.config_list(
        "sm120", "the table", "NVFP4_SM120_CONFIG", "name, m_max (-1: none), tile_m, tile_n, tile_k",
        ["// One line per config, in selection order (first m_max >= M wins). Define the macro, then include."],
        [(c.name, generated_files.bound(c.m_max), c.tile_m, c.tile_n, c.tile_k) for c in TABLE])


def render() -> dict[str, str]:
    assert all(a.m_max is not None and (b.m_max is None or a.m_max < b.m_max) for a, b in zip(TABLE, TABLE[1:])), \
        "TABLE must be ordered by m_max, unbounded last"
    assert TABLE[-1].m_max is None, "the last entry must take every remaining M"
    assert all(c.tile_m % 128 == 0 and c.tile_n % 128 == 0 and c.tile_k in (128, 256) for c in TABLE), \
        "tiles: M and N multiples of 128 (the scale-factor atom), K 128 or 256"
    assert [e for _, _, e in OUT_DTYPES] == ["kFloat16", "kBFloat16", "kFloat32"], "OutDtype order"
    files = {"table.inc": _table_inc()}
    for c in TABLE:
        files[f"{c.name}.cu"] = _cu(c)
    assert all(a.rows_max is not None and (b.rows_max is None or a.rows_max < b.rows_max)
               for a, b in zip(GROUPED_TABLE, GROUPED_TABLE[1:])), "GROUPED_TABLE must be ordered by rows_max"
    assert GROUPED_TABLE[-1].rows_max is None, "the last grouped entry must take every remaining T/G"
    assert all(c.tile_m % 128 == 0 and c.tile_n % 128 == 0 and c.tile_k in (128, 256) for c in GROUPED_TABLE)
    files["grouped_table.inc"] = _grouped_table_inc()
    for c in GROUPED_TABLE:
        files[f"{c.name}.cu"] = _grouped_cu(c)
    return files


def main() -> int:
    return generated_files.main(__doc__, render, OUT_DIR)


if __name__ == "__main__":
    sys.exit(main())
