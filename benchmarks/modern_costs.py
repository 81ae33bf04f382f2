"""Two speed questions of notebook 16, each answered by pairing the variants in one process on one thread:
(a) RMSNorm: the course's `RMSNorm` (separate tensor operations) against PyTorch's fused `F.rms_norm` and the fused
    `F.layer_norm` (the course's `LayerNorm`, and `nn.LayerNorm`, the same kernel: their gap shows the noise),
    forward + backward at notebook 16's training shape (batch 16, context 64, emb_dim 96) and at GPT-2 small's
    width (emb_dim 768), as ratios to the course's LayerNorm; and inside a whole training step of section 10's
    model (course_lib/data/make_modern_ablation.py's shape): GPT-2, the RMSNorm variant, and the RMSNorm variant
    with its norms swapped for the fused `nn.RMSNorm`.
(b) Muon: the share of a training step with Muon spent in the Newton-Schulz iterations (`orthogonalize`): a full
    step with `make_muon`, the same model's step with AdamW (`make_optimizer`), and `orthogonalize` alone on every
    matrix Muon updates (the matrices of the blocks), for GPT-2 and for the all-modern model; and an exact SVD of
    the same matrices, which section 9 says would be slow.

Every timed sample is a batch of calls (or steps); the variants of one group run once per round in a new random
order each round (no variant always first), after a warm-up. Each variant's time is the median over rounds; each
ratio and share is the median of the per-round ratios, with the smallest and largest of them (the spread): a
difference inside that spread is not a difference. Timings wander with the machine's load: run it alone.

    python benchmarks/modern_costs.py            # 1-2 minutes on 2 cores, alone on the machine
    python benchmarks/modern_costs.py --quick    # smoke run (seconds; numbers not meaningful)
"""

import random
from collections.abc import Callable

import torch
from torch import nn

from common import Run, Timings, fmt_s, median, parse_args, print_table, random_batch, time_interleaved
from course_lib.data.make_modern_ablation import MODERN, SHAPE, TCFG, VARIANTS
from course_lib.modern import ModernConfig, ModernGPT, RMSNorm, make_muon, orthogonalize
from course_lib.normalization import LayerNorm
from course_lib.training import TrainConfig, batch_loss, make_optimizer

NORM_SHAPES = {  # name: (batch, tokens, emb_dim)
    "notebook 16 (16 x 64, emb 96)": (16, 64, 96),
    "GPT-2 small width (16 x 64, emb 768)": (16, 64, 768),
}
QUICK_NORM_SHAPES = {"tiny (2 x 8, emb 32)": (2, 8, 32)}
NORM_BASE = "LayerNorm (course: F.layer_norm)"
STEP_BASE = "GPT-2 (baseline), AdamW"


def time_rounds(fns: dict[str, Callable[[], object]], rounds: int, seed: int = 0, warmup: int = 2) -> Timings:
    """common.time_interleaved, one round at a time, with the variants in a new random order each round (seeded):
    no variant always runs first or right after the same neighbour. Returns every round's seconds per name."""
    time_interleaved(fns, repeats=0, warmup=warmup)
    order = random.Random(seed)
    timings = Timings(wall={name: [] for name in fns}, cpu={name: [] for name in fns})
    for _ in range(rounds):
        names = order.sample(list(fns), len(fns))
        one = time_interleaved({name: fns[name] for name in names}, repeats=1, warmup=0)
        for name in names:
            timings.wall[name] += one.wall[name]
            timings.cpu[name] += one.cpu[name]
    return timings


def repeated(fn: Callable[[], object], times: int) -> Callable[[], None]:
    """fn called `times` times: one timed sample long enough for the clock (a norm call takes microseconds)."""
    def run():
        for _ in range(times):
            fn()
    return run


def ratio_stats(numerator: list[float], denominator: list[float]) -> dict:
    """Median, smallest and largest of the per-round ratios of two series timed in the same rounds."""
    ratios = [a / b for a, b in zip(numerator, denominator)]
    return {"median": median(ratios), "min": min(ratios), "max": max(ratios), "rounds": ratios}


def fmt_ratio(stats: dict, digits: int = 2) -> str:
    return f"{stats['median']:.{digits}f} ({stats['min']:.{digits}f}-{stats['max']:.{digits}f})"


def fmt_share(stats: dict) -> str:
    return f"{stats['median']:.0%} ({stats['min']:.0%}-{stats['max']:.0%})"


# ----------------------------------------------------------------------------- (a) the norms alone

def norm_variants(emb_dim: int, eps: float) -> dict[str, nn.Module]:
    """name -> norm over emb_dim; the two RMSNorms compute the same function, and so do the two LayerNorms."""
    fused_rms = nn.RMSNorm(emb_dim, eps=eps)
    return {"RMSNorm (course: tensor ops)": RMSNorm(emb_dim, eps), "RMSNorm (fused: F.rms_norm)": fused_rms,
            NORM_BASE: LayerNorm(emb_dim, eps), "nn.LayerNorm (the same kernel)": nn.LayerNorm(emb_dim, eps=eps)}


def measure_norms(shapes: dict, rounds: int, calls: int) -> tuple[list, list]:
    rows, results = [], []
    eps = ModernConfig().norm_eps
    for shape_name, (batch, tokens, emb_dim) in shapes.items():
        torch.manual_seed(0)
        norms = norm_variants(emb_dim, eps)
        x = torch.randn(batch, tokens, emb_dim, requires_grad=True)  # (batch, tokens, emb_dim)
        grad_out = torch.randn(batch, tokens, emb_dim)  # a fixed upstream gradient
        names = list(norms)
        torch.testing.assert_close(norms[names[0]](x), norms[names[1]](x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(norms[names[2]](x), norms[names[3]](x), rtol=1e-5, atol=1e-5)

        def forward_backward(norm):
            def fn():
                x.grad = None
                norm.zero_grad(set_to_none=True)
                norm(x).backward(grad_out)
            return fn

        timings = time_rounds({name: repeated(forward_backward(norm), calls) for name, norm in norms.items()},
                              rounds)
        base = timings.wall[NORM_BASE]
        result = {"shape": shape_name, "batch": batch, "tokens": tokens, "emb_dim": emb_dim, "eps": eps,
                  "calls_per_sample": calls, "variants": {}}
        for name in norms:
            per_call = [t / calls for t in timings.wall[name]]
            stats = ratio_stats(timings.wall[name], base)
            result["variants"][name] = {"median_s_per_call": median(per_call), "min_s_per_call": min(per_call),
                                        "max_s_per_call": max(per_call), "ratio_to_layernorm": stats,
                                        "cpu_ratio_to_layernorm": ratio_stats(timings.cpu[name],
                                                                              timings.cpu[NORM_BASE])}
            rows.append([shape_name, name, fmt_s(median(per_call)), f"{fmt_s(min(per_call))}-{fmt_s(max(per_call))}",
                         fmt_ratio(stats)])
        results.append(result)
    return rows, results


# ----------------------------------------------------------------------------- whole training steps

def make_step(model: nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor, targets: torch.Tensor,
              grad_clip: float) -> Callable[[], float]:
    """One step of notebook 09's `train` on a fixed batch (loss, zero_grad, backward, clip, step), at the optimizer's
    own learning rate: the schedule and the batch sampling cost nothing next to it."""
    model.train()

    def step() -> float:
        loss = batch_loss(model, ids, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        return loss.item()
    return step


def fuse_rms_norms(model: nn.Module) -> int:
    """Swap every course RMSNorm inside `model` for nn.RMSNorm (F.rms_norm) with the same scale; returns how many."""
    swapped = 0
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, RMSNorm):
                fused = nn.RMSNorm(child.emb_dim, eps=child.eps)
                with torch.no_grad():
                    fused.weight.copy_(child.scale)
                setattr(parent, child_name, fused)
                swapped += 1
    return swapped


def muon_matrices(muon: torch.optim.Optimizer) -> list[tuple[torch.Tensor, int]]:
    """A random matrix of every shape Muon updates, with its group's ns_steps."""
    return [(torch.randn_like(p), g["ns_steps"]) for g in muon.param_groups if g["muon"] for p in g["params"]]


def newton_schulz_alone(muon: torch.optim.Optimizer) -> Callable[[], None]:
    """orthogonalize on a matrix of every shape Muon updates, at its ns_steps: the iterations of one Muon step."""
    matrices = muon_matrices(muon)

    def run():
        for matrix, steps in matrices:
            orthogonalize(matrix, steps)
    return run


def svd_alone(muon: torch.optim.Optimizer) -> Callable[[], None]:
    """The exact U V^T of the same matrices by an SVD in float32: what section 9 says would be slow."""
    matrices = muon_matrices(muon)

    def run():
        for matrix, _ in matrices:
            u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
            u @ vh
    return run


def build_steps(steps_per_sample: int, shape: dict, tcfg: TrainConfig) -> tuple[dict, dict]:
    """name -> one timed sample (steps_per_sample training steps, or the Newton-Schulz calls of as many steps), and
    what each variant is (parameters, the matrices Muon orthogonalises)."""
    ids, targets = random_batch(tcfg.batch_size, shape["context_length"], shape["vocab_size"])
    fns, info = {}, {}
    for label, change, optimizers in (("GPT-2 (baseline)", VARIANTS["GPT-2 (baseline)"][0], ("adamw", "muon")),
                                      ("RMSNorm", VARIANTS["RMSNorm"][0], ("adamw",)),
                                      ("RMSNorm fused", VARIANTS["RMSNorm"][0], ("adamw",)),
                                      ("modern", MODERN, ("adamw", "muon"))):
        for optimizer_name in optimizers:
            torch.manual_seed(0)
            model = ModernGPT(ModernConfig(**shape, **change))
            swapped = fuse_rms_norms(model) if label == "RMSNorm fused" else 0
            if label == "RMSNorm fused":
                assert swapped == 2 * shape["n_layers"] + 1, swapped
            optimizer = make_optimizer(model, tcfg) if optimizer_name == "adamw" else make_muon(model, tcfg)
            name = f"{label}, {'AdamW' if optimizer_name == 'adamw' else 'Muon'}"
            step = make_step(model, optimizer, ids, targets, tcfg.grad_clip)
            fns[name] = repeated(step, steps_per_sample)
            info[name] = {"parameters": sum(p.numel() for p in model.parameters()), "norms_swapped": swapped,
                          "step": step}
            if optimizer_name == "muon":
                fns[f"{label}, Newton-Schulz alone"] = repeated(newton_schulz_alone(optimizer), steps_per_sample)
                fns[f"{label}, SVD alone"] = repeated(svd_alone(optimizer), steps_per_sample)
                info[name]["muon_matrices"] = [tuple(m.shape) for m, _ in muon_matrices(optimizer)]
    return fns, info


def measure_steps(rounds: int, steps_per_sample: int, shape: dict) -> tuple[list, list, dict]:
    tcfg = TrainConfig(**TCFG)
    fns, info = build_steps(steps_per_sample, shape, tcfg)
    # the fused swap must not change the function: same weights (seed 0), same batch, same first loss
    first = {name: entry.pop("step")() for name, entry in info.items()}
    assert abs(first["RMSNorm, AdamW"] - first["RMSNorm fused, AdamW"]) < 1e-4, first
    timings = time_rounds(fns, rounds)
    wall, cpu = timings.wall, timings.cpu
    base = wall[STEP_BASE]
    result = {"shape": shape, "batch_size": tcfg.batch_size, "steps_per_sample": steps_per_sample,
              "first_loss": first, "variants": {}}
    step_rows = []
    for name in fns:
        per_step = [t / steps_per_sample for t in wall[name]]
        entry = {"median_s_per_step": median(per_step), "min_s_per_step": min(per_step),
                 "max_s_per_step": max(per_step), "ratio_to_gpt2_adamw": ratio_stats(wall[name], base),
                 "cpu_ratio_to_gpt2_adamw": ratio_stats(cpu[name], cpu[STEP_BASE])}
        entry.update(info.get(name, {}))
        result["variants"][name] = entry
        step_rows.append([name, fmt_s(median(per_step)), f"{fmt_s(min(per_step))}-{fmt_s(max(per_step))}",
                          fmt_ratio(entry["ratio_to_gpt2_adamw"])])
    muon_rows, muon = [], {}
    for label in ("GPT-2 (baseline)", "modern"):
        adamw, with_muon, alone = (wall[f"{label}, {kind}"] for kind in ("AdamW", "Muon", "Newton-Schulz alone"))
        extra = [m - a for m, a in zip(with_muon, adamw)]
        muon[label] = {"muon_over_adamw": ratio_stats(with_muon, adamw),
                       "svd_over_newton_schulz": ratio_stats(wall[f"{label}, SVD alone"], alone),
                       "newton_schulz_share_of_muon_step": ratio_stats(alone, with_muon),
                       "newton_schulz_over_muon_extra": ratio_stats(alone, extra) if min(extra) > 0 else None,
                       "cpu_newton_schulz_share_of_muon_step": ratio_stats(cpu[f"{label}, Newton-Schulz alone"],
                                                                           cpu[f"{label}, Muon"])}
        muon_rows.append([label, fmt_ratio(muon[label]["muon_over_adamw"]),
                          fmt_share(muon[label]["newton_schulz_share_of_muon_step"]),
                          fmt_share(muon[label]["cpu_newton_schulz_share_of_muon_step"]),
                          fmt_ratio(muon[label]["newton_schulz_over_muon_extra"])
                          if muon[label]["newton_schulz_over_muon_extra"] else "n/a (extra <= 0 in a round)",
                          fmt_ratio(muon[label]["svd_over_newton_schulz"])])
    result["muon"] = muon
    return step_rows, muon_rows, result


def main():
    args = parse_args(__doc__)
    run = Run("modern_costs", args)
    rounds = args.repeats or (3 if args.quick else 21)
    calls = 3 if args.quick else 50
    steps_per_sample = 1 if args.quick else 4
    shapes = QUICK_NORM_SHAPES if args.quick else NORM_SHAPES

    norm_rows, norm_results = measure_norms(shapes, rounds, calls)
    print_table(["shape", "norm", "per call (median)", "rounds min-max", "x LayerNorm (min-max)"], norm_rows,
                title=f"(a) one norm, forward + backward, float32, {torch.get_num_threads()} thread(s); {rounds} "
                      f"rounds of {calls} calls, a new order each round; 'x LayerNorm' = median (smallest-largest) "
                      "of the per-round ratios to the course's LayerNorm")

    # --quick: the section 10 model made tiny, a smoke run of the same code
    shape = SHAPE | dict(n_layers=1, context_length=16, emb_dim=32) if args.quick else SHAPE
    step_rows, muon_rows, step_results = measure_steps(rounds, steps_per_sample, shape)
    print_table(["variant", "per step (median)", "rounds min-max", "x GPT-2 AdamW (min-max)"], step_rows,
                title=f"(a, b) one training step of notebook 16's section 10 model ({shape['n_layers']} layers, emb "
                      f"{shape['emb_dim']}, {TCFG['batch_size']} x {shape['context_length']} tokens): {rounds} rounds "
                      f"of {steps_per_sample} steps; 'Newton-Schulz alone' = orthogonalize on every matrix Muon "
                      "updates, as many times; 'SVD alone' = "
                      "the exact U V^T of the same matrices by torch.linalg.svd in float32")
    print_table(["model", "Muon step / AdamW step", "Newton-Schulz share of a Muon step", "same, by CPU time",
                 "Newton-Schulz / (Muon - AdamW)", "SVD / Newton-Schulz"], muon_rows,
                title="(b) Muon's cost: medians (smallest-largest) of the per-round ratios of wall time (CPU time: "
                      "what this process computed, less moved by other jobs on one thread)")
    run.finish({"rounds": rounds, "norm_calls_per_sample": calls, "norms": norm_results, "steps": step_results,
                "timing": "one process, torch threads as given, variants of a group in a new random order each round "
                          "(seed 0) after two warm-up calls; per-round ratios, their median and range"})


if __name__ == "__main__":
    main()
