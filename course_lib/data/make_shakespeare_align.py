"""Align notebook 14's chat model by DPO and, apart, by GRPO, with rewards a program checks; ship the adapters.

    python course_lib/data/make_shakespeare_align.py --workers 3             # writes shakespeare_dpo/ and _grpo/
    python course_lib/data/make_shakespeare_align.py --seeds 0 --out /tmp/a   # seed 0 alone, elsewhere, to compare
    python course_lib/data/make_shakespeare_align.py --small --seeds 0 --out /tmp/s  # about 5 minutes on a laptop

Stage 0, the start: `load_shakespeare_chat()`, the chat model of notebook 14, scored on its held-out instructions
(notebook 14's 400: 100 per task from the validation part of the corpus, no line found in the training part).
Stage 1, DPO, on dpo_tasks: training instructions are drawn from the training part; `dpo_samples` replies to
each are sampled from the chat model, and judge_reply picks a right one (chosen) and a wrong one (rejected). The
chat adapter's LoRA matrices keep training against a frozen copy of the chat model (the reference). Stage 2,
GRPO, on grpo_tasks: also from the chat model and against a frozen copy of it, on training instructions of its
tasks; reward 1 for a reply judge_reply accepts, 0 otherwise. Both stages start from the same model and are
judged on the same held-out instructions, so the two methods compare side by side.

A reply cut off at max_new_tokens, before its <|end|>, is never a chosen reply and always earns reward 0.

Both stages run once per training seed (--seeds; seed s offsets the seeds of the pair sampler, the batch order,
and GRPO's order by s), each seed in its own process of --threads torch threads. One sampler stream per seed
serves DPO's pairs and then GRPO's rollouts, so GRPO's draws depend on how many DPO's sampling took. While a
stage trains, it is watched every watch_every steps on every held-out instruction of its task(s): the mean reward of
watch_samples sampled replies and the KL to its reference. After each stage, score_policy on all held-out
instructions with one sampler stream seeded score_seed for every model (the instructions take their draws in turn,
so from the second on a model's earlier replies decide which draws an instruction gets): greedy exact match, the
mean reward of score_samples sampled replies (pass@1), pass@score_samples, and distinct replies. Noise: the larger
of the range over the training seeds and the widest 95% bootstrap half-width over the held-out instructions.
The gates of the fine-tuning issue are computed here and written on the cards.

Writes, per stage, adapter.safetensors (seed 0's LoRA matrices), card.json and README.md (command, recipe, numbers
of every seed, training histories, machine, sha256); shakespeare_dpo/ also holds pairs.json, seed 0's preference
pairs. Seeded: the same command on the same machine and thread count writes the same adapters, pairs and numbers
(the cards also record wall times, which differ).
"""

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from course_lib.alignment import (frozen_copy, grpo_step, kl_to_reference, pair_logprobs, policy_copy,
                                  preference_pairs, sample_group, score_policy, train_dpo)
from course_lib.data.make_classifier_results import bootstrap_half_width
from course_lib.data.make_shakespeare_chat import RECIPE as CHAT_RECIPE, SUBSET, instruction_sets
from course_lib.data.make_shakespeare_gpt import cpu_name, sha256
from course_lib.finetuning import (INSTRUCTION_TASKS, chat_reply, load_shakespeare_chat, lora_state_dict,
                                   make_instructions)
from course_lib.training import load_shakespeare

HERE = Path(__file__).resolve().parent
FOLDERS = {"dpo": "shakespeare_dpo", "grpo": "shakespeare_grpo"}
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class AlignRecipe:
    seed: int = 1234
    dpo_tasks: tuple = ("count",)  # on long lines the chat model's pass@8 is more than twice its pass@1: room to
    grpo_tasks: tuple = ("count",)  # sharpen (upper's was 0.37 against 0.22 in the first run: less than twice)
    min_line: int = 41  # both stages train and are judged on lines longer than notebook 14's (12 to 40 characters)
    max_line: int = 50  # the longest that leaves the context room for a prompt and a reply as long as the line
    long_per_task: int = 200  # held-out instructions on long lines, per trained task
    max_new_tokens: int = 64  # longest reply sampled (a right answer has at most 52 characters)
    # DPO
    dpo_per_task: int = 1000  # training instructions per task that pairs are sampled for
    dpo_samples: int = 4  # replies sampled per instruction
    dpo_beta: float = 0.5
    dpo_lr: float = 1e-4
    dpo_epochs: int = 3
    dpo_batch_size: int = 16
    # GRPO
    grpo_per_task: int = 1000  # training instructions per task, a new draw
    grpo_steps: int = 90
    grpo_prompts_per_step: int = 8
    grpo_group_size: int = 8
    grpo_beta: float = 0.04
    grpo_epsilon: float = 0.2
    grpo_iterations: int = 2
    grpo_lr: float = 1e-4
    grpo_loss_type: str = "grpo"
    grpo_kl_correction: bool = True  # TRL 1.16's default: the k3 term weighted by the ratio
    # watching and scoring
    watch_every: int = 15  # steps between held-out checks during training
    watch_samples: int = 4  # replies per held-out instruction of the stage's tasks (a stream seeded the same each time)
    kl_samples: int = 2  # replies per instruction for the KL estimate
    heldout_pair_samples: int = 8  # replies per held-out instruction of DPO's tasks, for the held-out pairs
    score_samples: int = 8  # replies per held-out instruction for the sampled reward and pass@8
    score_seed: int = 99  # the seed of the sampler stream of every score, the same for every model
    heldout_per_task: int | None = None  # the first n held-out instructions of each task; None: all of them


RECIPE = AlignRecipe()
SMALL = replace(RECIPE, dpo_per_task=300, dpo_epochs=2, grpo_per_task=200, grpo_steps=20, watch_every=5,
                heldout_per_task=25, long_per_task=50)  # --small: the same direction in about 5 minutes on a laptop


def heldout_set(recipe):
    """Notebook 14's held-out instructions, or the first heldout_per_task of each task."""
    heldout = instruction_sets(CHAT_RECIPE)[1]
    if recipe.heldout_per_task is None:
        return heldout
    return [e for task in INSTRUCTION_TASKS
            for e in [x for x in heldout if x["task"] == task][:recipe.heldout_per_task]]


def long_set(recipe):
    """Held-out instructions of the trained tasks on long lines (min_line to max_line characters), from the
    validation part, no line found in the training part: what both stages are judged on."""
    text = load_shakespeare()
    cut = int(len(text) * 0.9)
    return [e for e in make_instructions(text[cut:], recipe.long_per_task, recipe.seed + 5, exclude=text[:cut],
                                         max_line=recipe.max_line, min_line=recipe.min_line)
            if e["task"] in (*recipe.dpo_tasks, *recipe.grpo_tasks)]


def training_instructions(tasks, per_task, seed, recipe):
    """Instructions of `tasks` on long lines from the training part of the corpus (notebook 09's first 90%)."""
    text = load_shakespeare()
    return [e for e in make_instructions(text[:int(len(text) * 0.9)], per_task, seed, max_line=recipe.max_line,
                                         min_line=recipe.min_line) if e["task"] in tasks]


def prompt_scores(model, tokenizer, heldout, recipe):
    """score_policy of each held-out instruction alone (one sampler for all, seeded score_seed): the per-instruction
    numbers that a bootstrap resamples."""
    generator = torch.Generator().manual_seed(recipe.score_seed)
    return [score_policy(model, tokenizer, [e], recipe.score_samples, generator, recipe.max_new_tokens)[e["task"]]
            for e in heldout]


def summary(per_prompt, heldout):
    """Per task and in all: the mean of each number over its instructions, and the bootstrap half-width of the
    sampled reward."""
    table = {}
    for task in [*INSTRUCTION_TASKS, "all"]:
        rows = [row for row, e in zip(per_prompt, heldout) if task in (e["task"], "all")]
        if not rows:  # a set of some tasks only (the long lines)
            continue
        table[task] = {name: round(sum(r[name] for r in rows) / len(rows), 4) for name in rows[0]}
        table[task]["reward_bootstrap"] = round(bootstrap_half_width(torch.tensor([r["reward"] for r in rows])), 4)
    return table


def watcher(policy, reference, tokenizer, watch_set, recipe, watch_pairs=None, beta=None):
    """What training is watched by: the held-out sampled reward on every held-out instruction of the stage's tasks
    (RL's quantity) and the KL to the reference, from a sampler stream seeded the same at every watch; with held-out
    pairs (DPO), their preference accuracy, margin, and the mean log-ratios of the chosen and the rejected replies."""
    if watch_pairs:
        with torch.no_grad():
            ref_chosen, ref_rejected = pair_logprobs(reference, tokenizer, watch_pairs, policy.cfg.context_length)

    def watch():
        generator = torch.Generator().manual_seed(recipe.seed + 7)
        scored = score_policy(policy, tokenizer, watch_set, recipe.watch_samples, generator, recipe.max_new_tokens)
        found = {"heldout_reward": scored["all"]["reward"],
                 **{f"heldout_reward_{task}": row["reward"] for task, row in scored.items() if task != "all"},
                 "kl": kl_to_reference(policy, reference, tokenizer, watch_set, recipe.kl_samples, generator,
                                       recipe.max_new_tokens)}
        if watch_pairs:
            with torch.no_grad():
                chosen, rejected = pair_logprobs(policy, tokenizer, watch_pairs, policy.cfg.context_length)
            chosen, rejected = chosen - ref_chosen, rejected - ref_rejected  # log-ratios to the reference
            found.update(heldout_pref_accuracy=(chosen > rejected).float().mean().item(),
                         heldout_margin=beta * (chosen - rejected).mean().item(),
                         heldout_chosen_logratio=chosen.mean().item(), heldout_rejected_logratio=rejected.mean().item())
        return found
    return watch


def samples_of(model, tokenizer, examples, recipe):
    """Eight sampled replies to a few held-out instructions: what a group looks like, before and after."""
    generator = torch.Generator().manual_seed(recipe.seed + 11)
    return [{"instruction": e["instruction"], "replies": sample_group(model, tokenizer, e["instruction"], 8,
                                                                      generator, recipe.max_new_tokens)[2]}
            for e in examples]


def run_seed(seed, recipe, threads):
    """Both stages under training seed `seed`: histories, per-instruction scores and, for seed 0, what ships."""
    torch.set_num_threads(threads)
    heldout, long = heldout_set(recipe), long_set(recipe)
    chat, tokenizer = load_shakespeare_chat("cpu")
    dpo_watch = [e for e in long if e["task"] in recipe.dpo_tasks]
    grpo_watch = [e for e in long if e["task"] in recipe.grpo_tasks]
    shown = [e for task in INSTRUCTION_TASKS for e in [x for x in long if x["task"] == task][:4]]
    result = {"seed": seed}
    if seed == 0:
        result["chat_samples"] = samples_of(chat, tokenizer, shown, recipe)

    # Stage 1: DPO
    torch.manual_seed(recipe.seed + seed)
    generator = torch.Generator().manual_seed(recipe.seed + seed)
    pairs = preference_pairs(chat, tokenizer, training_instructions(recipe.dpo_tasks, recipe.dpo_per_task,
                                                                     recipe.seed + 2, recipe),
                             recipe.dpo_samples, generator, recipe.max_new_tokens)
    watch_pairs = preference_pairs(chat, tokenizer, dpo_watch, recipe.heldout_pair_samples, generator,
                                   recipe.max_new_tokens)
    reference, policy = frozen_copy(chat), policy_copy(chat)  # the chat adapter's LoRA matrices train; nothing else
    watch = watcher(policy, reference, tokenizer, dpo_watch, recipe, watch_pairs, recipe.dpo_beta)
    started = time.perf_counter()
    result["dpo_history"] = [{"step": 0, **watch()}] + train_dpo(
        policy, reference, tokenizer, pairs, recipe.dpo_beta, recipe.dpo_lr, recipe.dpo_epochs,
        recipe.dpo_batch_size, recipe.seed + seed, watch, recipe.watch_every)
    result["dpo_seconds"] = round(time.perf_counter() - started, 1)
    result["pairs"], result["heldout_pairs"] = len(pairs), len(watch_pairs)
    result["after DPO"] = {"heldout": prompt_scores(policy, tokenizer, heldout, recipe),
                           "long": prompt_scores(policy, tokenizer, long, recipe)}
    print(f"seed {seed} DPO: {len(pairs)} pairs, {result['dpo_seconds']:.0f} s", flush=True)
    if seed == 0:
        result["dpo_state"], result["pairs_list"] = lora_state_dict(policy), pairs
        result["dpo_samples"] = samples_of(policy, tokenizer, shown, recipe)

    # Stage 2: GRPO, from the chat model and against it, as DPO
    reference, policy = frozen_copy(chat), policy_copy(chat)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=recipe.grpo_lr,
                                  weight_decay=0.0)
    prompts = training_instructions(recipe.grpo_tasks, recipe.grpo_per_task, recipe.seed + 3, recipe)
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(recipe.seed + 4 + seed)).tolist()
    watch = watcher(policy, reference, tokenizer, grpo_watch, recipe)
    history, started = [{"step": 0, **watch()}], time.perf_counter()
    for step in range(recipe.grpo_steps):
        batch = [prompts[order[(step * recipe.grpo_prompts_per_step + i) % len(prompts)]]
                 for i in range(recipe.grpo_prompts_per_step)]
        record = grpo_step(policy, reference, tokenizer, batch, optimizer, recipe.grpo_group_size, recipe.grpo_beta,
                           recipe.grpo_epsilon, recipe.grpo_iterations, recipe.grpo_loss_type, generator,
                           recipe.max_new_tokens, recipe.grpo_kl_correction)
        history.append({"step": step + 1, **record})
        if (step + 1) % recipe.watch_every == 0:
            history[-1].update(watch())
            print(f"seed {seed} GRPO step {step + 1}: held-out reward {history[-1]['heldout_reward']:.3f}, "
                  f"KL {history[-1]['kl']:.3f}", flush=True)
    result["grpo_history"] = history
    result["grpo_seconds"] = round(time.perf_counter() - started, 1)
    result["after GRPO"] = {"heldout": prompt_scores(policy, tokenizer, heldout, recipe),
                            "long": prompt_scores(policy, tokenizer, long, recipe)}
    if seed == 0:
        result["grpo_state"] = lora_state_dict(policy)
        result["grpo_samples"] = samples_of(policy, tokenizer, shown, recipe)
        firsts = [i for task in INSTRUCTION_TASKS
                  for i in [n for n, e in enumerate(heldout) if e["task"] == task][:SUBSET]]
        result["heldout_replies"] = [{"index": i, "reply": chat_reply(policy, tokenizer, heldout[i]["instruction"],
                                                                      recipe.max_new_tokens)} for i in firsts]
    return result


def gates(chat_scores, runs, recipe):
    """The fine-tuning issue's gates, from the numbers on the long-line held-out set (the scores' "long" entries).
    DPO: on its tasks, the sampled reward after DPO minus the chat model's, at least 3 times the noise (the larger
    of the range over seeds and the widest bootstrap half-width, the chat model's included). GRPO, per task: the
    start's (the chat model's) pass@8 at least twice its pass@1; the mean of the last three watch points minus
    step 0, at least 3 times the noise (the larger of the range of that rise over seeds and the widest bootstrap
    half-width of the sampled reward after GRPO). The two gates measure different things, as the issue words
    them: DPO's its final scores, GRPO's its watch during training (whose step 0 is the same for every seed)."""
    found = {"dpo": {}, "grpo": {}}
    chat_scores = chat_scores["long"]
    runs = [{stage: run[stage]["long"] for stage in ("after DPO", "after GRPO")} | {"grpo_history": run["grpo_history"]}
            for run in runs]
    for task in recipe.dpo_tasks:
        after = [run["after DPO"][task]["reward"] for run in runs]
        widest = max([chat_scores[task]["reward_bootstrap"]] +
                     [run["after DPO"][task]["reward_bootstrap"] for run in runs])
        rise = sum(after) / len(after) - chat_scores[task]["reward"]
        noise = max(max(after) - min(after), widest)
        found["dpo"][task] = {"before": chat_scores[task]["reward"], "after": after, "rise": round(rise, 4),
                              "range": round(max(after) - min(after), 4), "bootstrap": widest,
                              "noise": round(noise, 4), "passed": rise > 0 and rise >= 3 * noise}
    for task in recipe.grpo_tasks:
        rises = []
        for run in runs:
            watched = [r[f"heldout_reward_{task}"] for r in run["grpo_history"] if "kl" in r]
            rises.append(sum(watched[-3:]) / 3 - watched[0])
        widest = max(run["after GRPO"][task]["reward_bootstrap"] for run in runs)
        noise, rise = max(max(rises) - min(rises), widest), sum(rises) / len(rises)
        start = chat_scores[task]  # where GRPO starts: the chat model, the same for every seed
        found["grpo"][task] = {"pass_at_1": start["reward"], "pass_at_n": start["pass_at_n"],
                               "sharpenable": 0 < 2 * start["reward"] <= start["pass_at_n"],
                               "watch_rise": [round(r, 4) for r in rises], "rise": round(rise, 4),
                               "range": round(max(rises) - min(rises), 4), "bootstrap": widest,
                               "noise": round(noise, 4), "passed": rise > 0 and rise >= 3 * noise}
    return found


def render_card(card, stage):
    """README.md of one stage, written from its card.json."""
    rows = []
    for held, stages in card["scores"].items():
        for name, by_seed in stages.items():
            for task in [t for t in [*INSTRUCTION_TASKS, "all"] if t in next(iter(by_seed.values()))]:
                cells = [by_seed[s][task] for s in by_seed]
                rows.append(f"| {held} | {name} | {task} | " + " | ".join(
                    " / ".join(f"{c[key]:.3f}" if key != "distinct" else f"{c[key]:.2f}" for c in cells)
                    for key in ("greedy", "reward", "pass_at_n", "distinct")) + " |")
    what = ("DPO on preference pairs a program judged (pairs.json: seed 0's), against the chat model as reference"
            if stage == "dpo" else
            "GRPO with judge_reply as the reward, from the chat model and against it as reference")
    gate, n = card["gates"][stage], card["recipe"]["score_samples"]
    lines = [f"# {FOLDERS[stage]}: notebook 14's chat model after {what}", "",
             "`course_lib.alignment.load_aligned(" + repr(stage) + ")` rebuilds it (training seed 0) from notebook "
             "14's chat model and adapter.safetensors (its LoRA matrices; nothing else trains). Made by:", "",
             f"    {card['command']}", "", f"Recipe: `{json.dumps(card['recipe'])}`", "",
             f"Wall time {card['wall_seconds'] / 60:.1f} min; machine: {card['machine']}", "",
             "## Gate", "", f"`{json.dumps(gate)}`", "",
             f"## Held-out scores (heldout: notebook 14's {card['heldout']} instructions; long: "
             f"{card['long']} on lines of {card['recipe']['min_line']} to {card['recipe']['max_line']} characters; "
             f"sampler seed {card['recipe']['score_seed']}; training seeds {' / '.join(map(str, card['seeds']))})", "",
             f"| set | model | task | greedy exact match | mean reward of {n} samples | pass@{n} | distinct replies "
             f"of {n} |", "|---|---|---|---|---|---|---|", *rows, "",
             "## Files", "", "| file | sha256 |", "|---|---|",
             *[f"| `{name}` | `{digest}` |" for name, digest in card["sha256"].items()], ""]
    return "\n".join(lines)


def write_stage(out, stage, state, card, extra_files=()):
    folder = out / FOLDERS[stage]
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, folder / "adapter.safetensors", metadata={"format": "pt"})
    for name, data in extra_files:
        (folder / name).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    card["sha256"] = {name: sha256(folder / name) for name in ["adapter.safetensors", *[n for n, _ in extra_files]]}
    (folder / "card.json").write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")
    (folder / "README.md").write_text(render_card(card, stage), encoding="utf-8")


def main(argv=None, recipe=RECIPE):
    """Run the recipe (tests pass a small one) for every seed and write both folders under --out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="the folder to write shakespeare_dpo/ and _grpo/ in")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="training seeds; 0 is shipped")
    parser.add_argument("--workers", type=int, default=1, help="processes, one seed each at a time")
    parser.add_argument("--small", action="store_true", help="the SMALL recipe: 300 instructions' pairs, 20 GRPO "
                        "steps, 25 held-out instructions per task; about 5 minutes on a laptop (with --seeds 0)")
    args = parser.parse_args(argv)
    if 0 not in args.seeds:
        parser.error("--seeds must include 0: its adapters are the ones written")
    if args.small:
        if args.out.resolve() == HERE.resolve():
            parser.error("--small writes a small run: give it an --out of its own, not the shipped folders")
        recipe = SMALL
    started = time.perf_counter()
    command = "python course_lib/data/make_shakespeare_align.py" + "".join(f" {a}" for a in (argv or []))
    machine = (f"{cpu_name()}, {os.cpu_count()} cores, {args.workers} process(es) of {args.threads} torch "
               f"thread(s), torch {torch.__version__}, Python {platform.python_version()}")
    sets = {"heldout": heldout_set(recipe), "long": long_set(recipe)}  # notebook 14's 400; the long lines
    with ProcessPoolExecutor(args.workers) as pool:
        jobs = [pool.submit(run_seed, seed, recipe, args.threads) for seed in args.seeds]
        torch.set_num_threads(args.threads)
        chat, tokenizer = load_shakespeare_chat("cpu")
        chat_scores = {held: summary(prompt_scores(chat, tokenizer, examples, recipe), examples)
                       for held, examples in sets.items()}
        print("chat", json.dumps(chat_scores["long"]["all"]), flush=True)
        runs = [job.result() for job in jobs]
    for run in runs:
        for stage in ("after DPO", "after GRPO"):
            run[stage] = {held: summary(run[stage][held], examples) for held, examples in sets.items()}
    first = runs[args.seeds.index(0)]
    found = gates(chat_scores, runs, recipe)
    scores = {held: {"chat (notebook 14)": {"all seeds": chat_scores[held]},
                     **{stage: {str(run["seed"]): run[stage][held] for run in runs}
                        for stage in ("after DPO", "after GRPO")}} for held in sets}
    common = {"command": command, "recipe": asdict(recipe), "seeds": [run["seed"] for run in runs],
              "heldout": len(sets["heldout"]), "long": len(sets["long"]), "gates": found, "machine": machine}
    dpo_card = {**common, "stage": "dpo", "pairs": {str(run["seed"]): run["pairs"] for run in runs},
                "heldout_pairs": {str(run["seed"]): run["heldout_pairs"] for run in runs},
                "scores": {held: {name: scores[held][name] for name in ("chat (notebook 14)", "after DPO")}
                           for held in scores},
                "history": {str(run["seed"]): run["dpo_history"] for run in runs},
                "train_seconds": {str(run["seed"]): run["dpo_seconds"] for run in runs},
                "samples": {"before": first["chat_samples"], "after": first["dpo_samples"]},
                "wall_seconds": round(time.perf_counter() - started, 1)}
    write_stage(args.out, "dpo", first["dpo_state"], dpo_card, [("pairs.json", first["pairs_list"])])
    grpo_card = {**common, "stage": "grpo", "scores": scores,
                 "history": {str(run["seed"]): run["grpo_history"] for run in runs},
                 "train_seconds": {str(run["seed"]): run["grpo_seconds"] for run in runs},
                 "samples": {"before": first["chat_samples"], "after": first["grpo_samples"]},
                 "heldout_replies": first["heldout_replies"], "wall_seconds": round(time.perf_counter() - started, 1)}
    write_stage(args.out, "grpo", first["grpo_state"], grpo_card)
    print(f"wrote {args.out}: {json.dumps(found)}")


if __name__ == "__main__":
    main(sys.argv[1:])
