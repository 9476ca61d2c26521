"""The kernel model on a real GPU: profile on a grid, predict shapes off the grid, compare with measurements.

Two steps, because the GPU is lent for minutes and the analysis needs none:

1. ``python benchmarks/gpu_kernels.py measure OUT`` (on a machine with one CUDA GPU) measures
   * the ceilings: device-to-device copy bandwidth, an 8192^3 bf16 matmul;
   * the kernel profiles ``treering calibrate`` would write (``profile_kernels``: attend and the small kernels,
     bf16 and fp32, on the full grid) -> ``OUT/profiles.yaml``;
   * the decode ``attend`` kernel (the merge core the schedules run) on random shapes off that grid (head dims
     calibrate does not profile, contexts 1k-200k log-uniform) -> ``OUT/decode.csv``;
   * causal prefill attention, ``torch.nn.functional.scaled_dot_product_attention`` forward and forward+backward in
     bf16, on a few fixed *calibration* shapes and on random *held-out* shapes -> ``OUT/prefill.csv``; and SDPA's
     profile as the simulator's ``attn-fwd`` / ``attn-bwd`` kernels (causal and full blocks) -> ``profiles.yaml``.
2. ``python benchmarks/gpu_kernels.py report OUT`` (anywhere) predicts every measured case with the simulator and
   prints the errors:
   * decode: the profile's log-space interpolation (``KernelProfile.predict``) against the measured time, and the
     plain roofline of the ``h200-sxm`` preset beside it;
   * prefill: the simulator's ``single`` prefill schedule on one H200 (``hgx-h200``), whose attention kernels run at
     ``attention_efficiency`` of peak: once with the preset as it is (its tile model of FlashAttention-3,
     ``docs/kernels.md``; SDPA runs FlashAttention-2's kernels), once on the roofline with the forward and backward
     efficiencies measured on the calibration shapes only. The held-out shapes are never used to set anything.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

CAL_PREFILL = [(1, 32, 8, 128, 16384), (1, 16, 16, 64, 8192), (2, 32, 32, 128, 8192)]  # b, heads, kv, d, seq


def _measure(out: Path, smoke: bool) -> None:
    import torch
    import torch.nn.functional as F
    import yaml

    from simulator.distributed.measure import robust_time
    from simulator.distributed.profile_kernels import (
        ATTEND_GRID,
        ELEMS_GRID,
        QUICK_ATTEND_GRID,
        QUICK_ELEMS_GRID,
        ProfileOptions,
        profile_attend,
        profile_small,
    )
    from simulator.distributed.random_shapes import HEAD_DIMS
    from simulator.kernels.profiles import profile_to_yaml
    from simulator.merge import merge, partial_attention

    dev = torch.device("cpu" if smoke else "cuda")
    sync = (lambda: None) if smoke else torch.cuda.synchronize
    out.mkdir(parents=True, exist_ok=True)
    n_decode, n_prefill, scale = (3, 2, 1 / 64) if smoke else (48, 24, 1.0)
    grids = (QUICK_ATTEND_GRID, QUICK_ELEMS_GRID) if smoke else (ATTEND_GRID, ELEMS_GRID)
    print(dev if smoke else torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)
    copy_bw, mm = _ceilings(dev, sync, 1 if smoke else 8)
    print(f"copy {copy_bw / 1e12:.2f} TB/s (read + write), bf16 matmul {mm / 1e12:.0f} TFLOP/s", flush=True)
    (out / "ceilings.txt").write_text(f"copy_Bps {copy_bw}\nmatmul_bf16_flops {mm}\n")

    t0 = time.time()
    opts = ProfileOptions(budget_s=0.3, max_ci=100.0 if smoke else 0.5)
    body: dict[str, Any] = {}
    for dtype in ("bf16", "fp32"):
        profiles = [profile_attend(dtype, dev, opts, grids[0])] + [
            profile_small(k, dtype, dev, opts, grids[1]) for k in ("merge", "rescale", "finalize", "finalize-flat")]
        for p in profiles:
            body.setdefault(p.kernel, {})[p.dtype] = profile_to_yaml(p)
    t1 = time.time()
    for p in _profile_sdpa(dev, sync, smoke):
        body.setdefault(p.kernel, {})[p.dtype] = profile_to_yaml(p)
    (out / "profiles.yaml").write_text(yaml.safe_dump({"kernels": body}, sort_keys=False, width=120))
    print(f"profiles in {time.time() - t0:.0f} s (SDPA {time.time() - t1:.0f} s)", flush=True)

    rng = random.Random(2026)
    rows = []
    t0 = time.time()
    while len(rows) < n_decode:
        heads = rng.randint(1, 32)
        kvh = rng.choice([d for d in range(1, heads + 1) if heads % d == 0])
        b, d, dtype = rng.randint(1, 8), rng.choice(HEAD_DIMS), rng.choice(["bf16", "fp32"])
        tokens = max(8, round(scale * math.exp(rng.uniform(math.log(1024), math.log(200_000)))))
        elem = 2 if dtype == "bf16" else 4
        if 2 * b * kvh * tokens * d * elem > 4 * 2**30:
            continue
        tdt = torch.bfloat16 if dtype == "bf16" else torch.float32
        q = torch.randn(b, heads, 1, d, device=dev, dtype=tdt)
        k = torch.randn(b, kvh, tokens, d, device=dev, dtype=tdt)
        v = torch.randn_like(k)
        acc = partial_attention(q, k[:, :, :1], v[:, :, :1], 0.1)
        t = robust_time(lambda q=q, k=k, v=v, acc=acc: merge(acc, partial_attention(q, k, v, 0.1)), sync,
                        budget_s=0.3)
        rows.append({"batch": b, "heads": heads, "kv_heads": kvh, "head_dim": d, "tokens": tokens, "dtype": dtype,
                     "seconds": t.median, "q1": t.q1, "q3": t.q3})
        del q, k, v, acc
    _write(out / "decode.csv", rows)
    print(f"decode: {len(rows)} shapes in {time.time() - t0:.0f} s", flush=True)

    shapes = [("calibration", b, h, kv, d, max(16, round(n * scale))) for b, h, kv, d, n in CAL_PREFILL]
    while len(shapes) < len(CAL_PREFILL) + n_prefill:
        heads = rng.choice([8, 12, 16, 24, 32, 40, 48, 64])
        kvh = rng.choice([d for d in (1, 2, 4, 8, heads) if heads % d == 0])
        shapes.append(("held-out", rng.randint(1, 2), heads, kvh, rng.choice([64, 96, 128, 256]),
                       max(16, round(scale * math.exp(rng.uniform(math.log(2048), math.log(65536)))))))
    rows = []
    t0 = time.time()
    for role, b, h, kvh, d, n in shapes:
        q = torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, kvh, n, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn_like(k, requires_grad=True)
        do = torch.randn_like(q)

        def fwd(q=q, k=k, v=v, gqa=kvh != h) -> Any:
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

        def fwd_bwd(q=q, k=k, v=v, do=do, gqa=kvh != h) -> None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            o.backward(do)

        tf = robust_time(fwd, sync, budget_s=0.5)
        tb = robust_time(fwd_bwd, sync, budget_s=0.5)
        rows.append({"role": role, "batch": b, "heads": h, "kv_heads": kvh, "head_dim": d, "sequence": n,
                     "forward_s": tf.median, "forward_backward_s": tb.median, "fwd_spread": tf.spread,
                     "fwdbwd_spread": tb.spread})
        del q, k, v, do
    _write(out / "prefill.csv", rows)
    print(f"prefill: {len(rows)} shapes in {time.time() - t0:.0f} s", flush=True)


SDPA_GRID = ((2.0**16, 2.0**18, 2.0**20, 2.0**22), (2.0**10, 2.0**12, 2.0**14, 2.0**16), (64.0, 128.0, 256.0),
             (0.5, 1.0))
SMOKE_SDPA_GRID = ((2.0**8, 2.0**10), (2.0**6, 2.0**8), (32.0, 64.0), (0.5, 1.0))


def _profile_sdpa(dev: Any, sync: Any, smoke: bool) -> list[Any]:
    """Profiles of SDPA (bf16) as the simulator's ``attn-fwd`` and ``attn-bwd`` kernels, on their axes (row_heads =
    heads x query rows, span = keys, head_dim, density = the share of pairs the mask keeps): a sequence of n tokens
    attending to itself, causal (density (n + 1) / 2n, recorded as 0.5) or not (1). The backward is (forward +
    backward) - forward."""
    import torch
    import torch.nn.functional as F

    from simulator.distributed.measure import robust_time
    from simulator.kernels.profiles import KernelProfile
    from simulator.kernels.table import PROFILE_AXES

    grid = SMOKE_SDPA_GRID if smoke else SDPA_GRID
    fwd_s, bwd_s, fwd_sp, bwd_sp = [], [], [], []
    for row_heads, span, d, density in itertools.product(*grid):
        n = round(span)
        bh = max(1, round(row_heads / n))
        causal = density < 1
        q, k, v = (torch.randn(1, bh, n, int(d), device=dev, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        do = torch.randn_like(q)

        def fwd(q=q, k=k, v=v, causal=causal) -> Any:
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def fwd_bwd(q=q, k=k, v=v, do=do, causal=causal) -> None:
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do)

        tf = robust_time(fwd, sync, budget_s=0.5)
        tb = robust_time(fwd_bwd, sync, budget_s=0.5)
        fwd_s.append(tf.median)
        bwd_s.append(max(tb.median - tf.median, 1e-9))
        fwd_sp.append(tf.spread)
        bwd_sp.append(tb.spread)
        q = k = v = do = None
    axes = PROFILE_AXES["attn-fwd"]
    return [KernelProfile("attn-fwd", "bf16", axes, grid, tuple(fwd_s), tuple(fwd_sp)),
            KernelProfile("attn-bwd", "bf16", axes, grid, tuple(bwd_s), tuple(bwd_sp))]


def _ceilings(dev: Any, sync: Any, scale: int) -> tuple[float, float]:
    """(device-to-device copy bytes/s, read + write; bf16 matmul FLOP/s) on ``scale`` x 1 GiB / 8192^3 / 8."""
    import torch

    from simulator.distributed.measure import robust_time

    x = torch.empty(scale * 2**27, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    t = robust_time(lambda: y.copy_(x), sync, budget_s=1.0)
    copy_bw = 2 * x.numel() / t.median
    n = 1024 * scale
    a = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    t = robust_time(lambda: a @ a, sync, budget_s=1.0)
    return copy_bw, 2 * n**3 / t.median


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _read(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [{k: (v if k in ("dtype", "role") else float(v)) for k, v in row.items()} for row in csv.DictReader(f)]


def _stats(errs: list[float]) -> str:
    a = sorted(abs(e) for e in errs)
    p90 = a[min(len(a) - 1, math.ceil(0.9 * len(a)) - 1)]
    return f"median |error| {statistics.median(a):.1f} %, 90th percentile {p90:.1f} %, max {a[-1]:.1f} %"


def _report(out: Path) -> None:
    import yaml

    from simulator.cluster.devices import compute_time
    from simulator.cluster.topology import load_topology
    from simulator.kernels.profiles import parse_kernel_profiles
    from simulator.kernels.table import OPTIONAL_AXES, PROFILE_AXES
    from simulator.workloads.shape import DecodeShape

    raw = yaml.safe_load((out / "profiles.yaml").read_text())["kernels"]
    profiles = parse_kernel_profiles(raw, PROFILE_AXES, ["bf16", "fp32"], lambda sub, err: err, OPTIONAL_AXES)
    spec = load_topology("hgx-h200", {"nodes": 1}).specs
    h200 = next(iter(spec.values()))
    print("## Decode attend kernel (merge core, torch) on random shapes off the profiled grid\n")
    print("| batch | heads | kv | head_dim | tokens | dtype | measured ms | profile ms | error | roofline ms | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    e_prof, e_roof, outside_n = [], [], 0
    for r in _read(out / "decode.csv"):
        shape = DecodeShape(int(r["batch"]), int(r["heads"]), int(r["head_dim"]), int(r["kv_heads"]),
                            int(r["tokens"]), str(r["dtype"]))
        dims = (shape.kv_bytes(int(r["tokens"])), float(r["head_dim"]), r["heads"] / r["kv_heads"],
                float(r["batch"] * r["kv_heads"]))  # rows: read by a profile over them, left by one without
        pred, outside = profiles[("attend", str(r["dtype"]))].predict(dims)
        outside_n += bool(outside)
        flops, nbytes = shape.attend_cost(int(r["tokens"]))
        roof = compute_time(h200, flops, nbytes, str(r["dtype"]))
        e1, e2 = 100 * (pred / r["seconds"] - 1), 100 * (roof / r["seconds"] - 1)
        e_prof.append(e1)
        e_roof.append(e2)
        print(f"| {int(r['batch'])} | {int(r['heads'])} | {int(r['kv_heads'])} | {int(r['head_dim'])} | "
              f"{int(r['tokens'])} | {r['dtype']} | {r['seconds'] * 1e3:.3f} | {pred * 1e3:.3f} | {e1:+.0f} % | "
              f"{roof * 1e3:.3f} | {e2:+.0f} % |")
    print(f"\nprofile: {_stats(e_prof)} ({outside_n} of {len(e_prof)} extrapolated on some axis)")
    print(f"roofline (h200-sxm preset): {_stats(e_roof)}\n")

    rows = _read(out / "prefill.csv")
    cal = [r for r in rows if r["role"] == "calibration"]
    eff = {}
    for col, key in (("forward_s", "forward"), ("forward_backward_s", "backward")):
        roof = {"forward": h200.eff_flops, "backward": h200.eff_flops}  # the roofline (not the preset's tile model)
        base = [_single(r, roof) for r in cal]  # at eff_flops; the time scales as 1 / efficiency
        ratios = [b[col] / r[col] for b, r in zip(base, cal, strict=True)]
        eff[key] = statistics.median(ratios) * h200.eff_flops
    print("## Causal prefill attention (SDPA, bf16) on one H200: the simulator's `single` schedule\n")
    print(f"attention efficiency measured on the {len(cal)} calibration shapes: forward {eff['forward']:.3f}, "
          f"forward+backward {eff['backward']:.3f} (the preset has none: eff_flops {h200.eff_flops})\n")
    print("| role | batch | heads | kv | head_dim | sequence | fwd ms | pred (preset) | pred (calibrated) | "
          "fwd+bwd ms | pred (preset) | pred (calibrated) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    errs: dict[str, list[float]] = {"fp": [], "fc": [], "bp": [], "bc": []}
    for r in rows:
        pre, calib = _single(r, {}), _single(r, eff)
        cells = []
        for col, p_key, c_key in (("forward_s", "fp", "fc"), ("forward_backward_s", "bp", "bc")):
            ep, ec = 100 * (pre[col] / r[col] - 1), 100 * (calib[col] / r[col] - 1)
            if r["role"] == "held-out":
                errs[p_key].append(ep)
                errs[c_key].append(ec)
            cells.append(f"{r[col] * 1e3:.2f} | {pre[col] * 1e3:.2f} ({ep:+.0f} %) | {calib[col] * 1e3:.2f} "
                         f"({ec:+.0f} %)")
        print(f"| {r['role']} | {int(r['batch'])} | {int(r['heads'])} | {int(r['kv_heads'])} | {int(r['head_dim'])} "
              f"| {int(r['sequence'])} | " + " | ".join(cells) + " |")
    print(f"\nheld-out forward: preset {_stats(errs['fp'])}; calibrated {_stats(errs['fc'])}")
    print(f"held-out forward+backward: preset {_stats(errs['bp'])}; calibrated {_stats(errs['bc'])}")
    if "attn-fwd" not in raw:
        return
    topo = _profiled_topology(out, raw, h200)
    print("\n## The same, with the attention kernels timed from their profile over shapes (kernels: attn-fwd, "
          "attn-bwd)\n")
    print("| role | batch | heads | kv | head_dim | sequence | fwd ms | pred (profile) | fwd+bwd ms | pred (profile) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    pf, pb = [], []
    for r in rows:
        pred = _single(r, {}, topo)
        ef = 100 * (pred["forward_s"] / r["forward_s"] - 1)
        eb = 100 * (pred["forward_backward_s"] / r["forward_backward_s"] - 1)
        if r["role"] == "held-out":
            pf.append(ef)
            pb.append(eb)
        print(f"| {r['role']} | {int(r['batch'])} | {int(r['heads'])} | {int(r['kv_heads'])} | {int(r['head_dim'])} "
              f"| {int(r['sequence'])} | {r['forward_s'] * 1e3:.2f} | {pred['forward_s'] * 1e3:.2f} ({ef:+.0f} %) | "
              f"{r['forward_backward_s'] * 1e3:.2f} | {pred['forward_backward_s'] * 1e3:.2f} ({eb:+.0f} %) |")
    print(f"\nheld-out forward, profile: {_stats(pf)}")
    print(f"held-out forward+backward, profile: {_stats(pb)}")


def _profiled_topology(out: Path, raw: dict[str, Any], spec: Any) -> str:
    """One H200 (the preset's figures) whose attention kernels carry the measured profiles."""
    import yaml

    dev = {"peak_flops": {k: f"{v:.6g} FLOP/s" for k, v in spec.peak_flops.items()},
           "mem_bw": f"{spec.mem_bw_Bps:.6g} B/s", "mem": f"{spec.mem_bytes:.6g} B",
           "launch_overhead": f"{spec.launch_s * 1e6:.6g} us", "eff_mem": spec.eff_mem, "eff_flops": spec.eff_flops,
           "kernels": {k: raw[k] for k in ("attn-fwd", "attn-bwd")}}
    body = {"name": "h200-profiled", "devices": {"h200-profiled": dev},
            "nodes": [{"name": "gpu0", "kind": "gpu", "device": "h200-profiled"}, {"name": "sw", "kind": "switch"}],
            "links": [{"a": "gpu0", "b": "sw", "bandwidth": "450 GB/s", "latency": "1 us"}]}
    path = out / "h200-profiled.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False, width=120))
    return str(path.resolve())


def _single(r: dict[str, Any], eff: dict[str, float], topology: str = "hgx-h200") -> dict[str, float]:
    """The simulator's latency of the ``single`` prefill schedule (forward, forward+backward) for row ``r``."""
    from simulator.run.prepare import prepare_point, simulate_point
    from simulator.run.scenario import scenario_points

    out = {}
    for col, backward in (("forward_s", False), ("forward_backward_s", True)):
        tree = {"name": "gpu-check", "topology": topology,
                "topology_params": {"nodes": 1} if topology == "hgx-h200" else {},
                "workload": {"kind": "prefill", "model": {"heads": int(r["heads"]), "kv_heads": int(r["kv_heads"]),
                                                          "head_dim": int(r["head_dim"])},
                             "batch": int(r["batch"]), "sequence": int(r["sequence"]), "dtype": "bf16",
                             "causal": True, "layout": "contiguous", "backward": backward},
                "algorithms": ["single"]}
        if eff:
            tree["devices"] = {"h200-sxm": {"attention_efficiency": dict(eff)}}
        (point,) = scenario_points(tree, "benchmarks/gpu_kernels.py", Path("."))
        rows = simulate_point(prepare_point(point)).rows
        out[col] = float(rows[0]["latency_s"])
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("step", choices=["measure", "report"])
    p.add_argument("out", type=Path)
    p.add_argument("--smoke", action="store_true", help="measure: a few tiny cases on the CPU (checks the script)")
    args = p.parse_args(argv)
    _measure(args.out, args.smoke) if args.step == "measure" else _report(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
