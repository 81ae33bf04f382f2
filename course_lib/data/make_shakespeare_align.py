"""Align notebook 14's chat model in two stages, DPO then GRPO, with rewards a program checks; ship the adapters.

    python course_lib/data/make_shakespeare_align.py --threads 1               # writes shakespeare_dpo/, shakespeare_grpo/
    python course_lib/data/make_shakespeare_align.py --threads 1 --out /tmp/a  # a rebuild elsewhere, to compare

Stage 0, the start: `load_shakespeare_chat()`, the chat model of notebook 14, scored on its held-out instructions
(notebook 14's 200: 50 per task from the validation part of the corpus, no line found in the training part).
Stage 1, DPO: training instructions of the two tasks where the model is sometimes right (speaker, continue) are
drawn from the training part; `samples` replies to each are sampled from the chat model, and check_reply picks a
right one (chosen) and a wrong one (rejected). The chat adapter's LoRA matrices keep training against a frozen copy
of the chat model (the reference). Stage 2, GRPO: from the DPO model, against a frozen copy of it, on new training
instructions of the same tasks; reward 1 for a reply check_reply accepts, 0 otherwise.

A reply cut off at max_new_tokens, before its <|end|>, is never a chosen reply and always earns reward 0.

Every stage is scored the same way (score_policy): greedy exact match, and the mean reward of 8 replies sampled at
temperature 1, on the 200 held-out instructions, with two sampler seeds (their difference is the noise of the
measurement). Writes, per stage, adapter.safetensors (the LoRA matrices), card.json and README.md (command, recipe,
numbers, training history, machine, sha256); shakespeare_dpo/ also holds pairs.json, the preference pairs. Seeded:
the same command on the same machine and thread count writes the same adapters, pairs and numbers (the cards also
record wall times, which differ).
"""

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from course_lib.alignment import (frozen_copy, grpo_step, kl_to_reference, pair_logprobs, policy_copy,
                                  preference_pairs, sample_group, score_policy, train_dpo)
from course_lib.data.make_shakespeare_chat import RECIPE as CHAT_RECIPE, SUBSET, instruction_sets
from course_lib.data.make_shakespeare_gpt import cpu_name, sha256
from course_lib.finetuning import INSTRUCTION_TASKS, chat_reply, load_shakespeare_chat, lora_state_dict, make_instructions
from course_lib.training import load_shakespeare

HERE = Path(__file__).resolve().parent
FOLDERS = {"dpo": "shakespeare_dpo", "grpo": "shakespeare_grpo"}


@dataclass(frozen=True)
class AlignRecipe:
    seed: int = 1234
    tasks: tuple = ("speaker", "continue")  # the tasks where the chat model is sometimes right: a checker's signal
    max_new_tokens: int = 64  # longest reply sampled (a right answer has at most 52 characters)
    # DPO
    dpo_per_task: int = 400  # training instructions per task that pairs are sampled for
    dpo_samples: int = 4  # replies sampled per instruction
    dpo_beta: float = 0.5
    dpo_lr: float = 1e-4
    dpo_epochs: int = 3
    dpo_batch_size: int = 16
    # GRPO
    grpo_per_task: int = 400  # training instructions per task, a new draw
    grpo_steps: int = 150
    grpo_prompts_per_step: int = 4
    grpo_group_size: int = 8
    grpo_beta: float = 0.04
    grpo_epsilon: float = 0.2
    grpo_iterations: int = 2
    grpo_lr: float = 1e-4
    grpo_loss_type: str = "grpo"
    grpo_kl_correction: bool = True  # TRL 1.16's default: the k3 term weighted by the ratio
    # watching and scoring
    watch_every: int = 10  # steps between held-out checks during training
    watch_prompts: int = 12  # held-out instructions per task whose reward and KL are watched while training
    watch_samples: int = 4  # replies per watched instruction (the same random numbers at every watch)
    heldout_pair_samples: int = 8  # replies per held-out instruction for the held-out preference pairs
    kl_samples: int = 4  # replies per instruction for the KL estimate
    score_samples: int = 8  # replies per held-out instruction for the sampled reward
    score_seeds: tuple = (99, 100)  # two sampler seeds: the spread of the held-out reward


RECIPE = AlignRecipe()


def training_instructions(recipe, per_task, seed):
    """Instructions of the recipe's tasks from the training part of the corpus (notebook 09's first 90%)."""
    text = load_shakespeare()
    return [e for e in make_instructions(text[:int(len(text) * 0.9)], per_task, seed) if e["task"] in recipe.tasks]


def scores(model, tokenizer, heldout, recipe):
    """score_policy with each sampler seed of the recipe: {seed: {task: {greedy, reward, distinct}}}."""
    return {str(seed): score_policy(model, tokenizer, heldout, recipe.score_samples,
                                    torch.Generator().manual_seed(seed), recipe.max_new_tokens)
            for seed in recipe.score_seeds}


def watcher(policy, reference, tokenizer, watch_set, watch_pairs, ref_logps, recipe, beta):
    """What training is watched by: the held-out sampled reward on a few instructions (RL's quantity) and the KL to
    the reference, both with the same random numbers at every watch; with pairs (DPO), the held-out preference
    accuracy, margin and chosen log-prob."""

    def watch():
        generator = torch.Generator().manual_seed(recipe.seed + 7)
        found = {"heldout_reward": score_policy(policy, tokenizer, watch_set, recipe.watch_samples, generator,
                                                recipe.max_new_tokens)["all"]["reward"],
                 "kl": kl_to_reference(policy, reference, tokenizer, watch_set, recipe.kl_samples, generator,
                                       recipe.max_new_tokens)}
        if watch_pairs:
            with torch.no_grad():
                chosen, rejected = pair_logprobs(policy, tokenizer, watch_pairs, policy.cfg.context_length)
            margin = beta * ((chosen - ref_logps[0]) - (rejected - ref_logps[1]))
            found.update(heldout_pref_accuracy=(margin > 0).float().mean().item(),
                         heldout_margin=margin.mean().item(), heldout_chosen_logprob=chosen.mean().item())
        return found
    return watch


def replies_of(model, tokenizer, heldout, recipe):
    firsts = [i for task in INSTRUCTION_TASKS for i in [n for n, e in enumerate(heldout) if e["task"] == task][:SUBSET]]
    return [{"index": i, "reply": chat_reply(model, tokenizer, heldout[i]["instruction"], recipe.max_new_tokens)}
            for i in firsts]


def samples_of(model, tokenizer, examples, recipe):
    """Eight sampled replies to a few held-out instructions: what a group looks like, before and after."""
    generator = torch.Generator().manual_seed(recipe.seed + 11)
    return [{"instruction": e["instruction"], "replies": sample_group(model, tokenizer, e["instruction"], 8,
                                                                      generator, recipe.max_new_tokens)[2]}
            for e in examples]


def render_card(card, stage):
    """README.md of one stage, written from its card.json."""
    rows = []
    for name, by_seed in card["scores"].items():
        for task in [*INSTRUCTION_TASKS, "all"]:
            greedy = by_seed[next(iter(by_seed))][task]["greedy"]
            rewards = " / ".join(f"{by_seed[s][task]['reward']:.3f}" for s in by_seed)
            distinct = " / ".join(f"{by_seed[s][task]['distinct']:.2f}" for s in by_seed)
            rows.append(f"| {name} | {task} | {greedy:.0%} | {rewards} | {distinct} |")
    what = ("DPO on preference pairs a program judged (pairs.json), against the chat model as reference"
            if stage == "dpo" else "GRPO with check_reply as the reward, from the DPO model and against it as reference")
    lines = [f"# {FOLDERS[stage]}: notebook 14's chat model after {what}", "",
             "`course_lib.alignment.load_aligned(" + repr(stage) + ")` rebuilds it from notebook 14's chat model and "
             "adapter.safetensors (its LoRA matrices; nothing else trains). Made by:", "", f"    {card['command']}", "",
             f"Recipe: `{json.dumps(card['recipe'])}`", "",
             f"Wall time {card['wall_seconds'] / 60:.1f} min; machine: {card['machine']}", "",
             "## Held-out scores (notebook 14's 200 instructions; reward and distinct: sampler seeds "
             f"{' / '.join(next(iter(card['scores'].values())))})", "",
             "| model | task | greedy exact match | mean reward of 8 samples | distinct replies of 8 |",
             "|---|---|---|---|---|", *rows, "",
             "## Files", "", "| file | sha256 |", "|---|---|",
             *[f"| `{name}` | `{digest}` |" for name, digest in card["sha256"].items()], ""]
    return "\n".join(lines)


def write_stage(out, stage, model, card, extra_files=()):
    folder = out / FOLDERS[stage]
    folder.mkdir(parents=True, exist_ok=True)
    save_file(lora_state_dict(model), folder / "adapter.safetensors", metadata={"format": "pt"})
    for name, data in extra_files:
        (folder / name).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    card["sha256"] = {name: sha256(folder / name) for name in ["adapter.safetensors", *[n for n, _ in extra_files]]}
    (folder / "card.json").write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")
    (folder / "README.md").write_text(render_card(card, stage), encoding="utf-8")


def main(argv=None, recipe=RECIPE):
    """Run the recipe (tests pass a small one) and write both folders under --out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="the folder to write shakespeare_dpo/ and _grpo/ in")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's choice)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    command = "python course_lib/data/make_shakespeare_align.py" + "".join(f" {a}" for a in (argv or []))
    machine = (f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s), "
               f"torch {torch.__version__}, Python {platform.python_version()}")
    heldout = instruction_sets(CHAT_RECIPE)[1]  # notebook 14's held-out 200
    watch_set = [e for task in recipe.tasks for e in [x for x in heldout if x["task"] == task][:recipe.watch_prompts]]
    chat, tokenizer = load_shakespeare_chat("cpu")
    score = {"chat (notebook 14)": scores(chat, tokenizer, heldout, recipe)}
    print("chat", json.dumps(score["chat (notebook 14)"][str(recipe.score_seeds[0])]["all"]), flush=True)

    # Stage 1: DPO
    torch.manual_seed(recipe.seed)
    generator = torch.Generator().manual_seed(recipe.seed)
    pairs = preference_pairs(chat, tokenizer, training_instructions(recipe, recipe.dpo_per_task, recipe.seed + 2),
                             recipe.dpo_samples, generator, recipe.max_new_tokens)
    heldout_tasks = [e for e in heldout if e["task"] in recipe.tasks]  # every held-out instruction of the tasks
    watch_pairs = preference_pairs(chat, tokenizer, heldout_tasks, recipe.heldout_pair_samples, generator,
                                   recipe.max_new_tokens)
    print(f"{len(pairs)} training pairs, {len(watch_pairs)} held-out pairs, {time.perf_counter() - started:.0f} s",
          flush=True)
    reference, policy = frozen_copy(chat), policy_copy(chat)  # the chat adapter's LoRA matrices train; nothing else
    with torch.no_grad():
        watch_ref = pair_logprobs(reference, tokenizer, watch_pairs, chat.cfg.context_length)
    watch = watcher(policy, reference, tokenizer, watch_set, watch_pairs, watch_ref, recipe, recipe.dpo_beta)
    dpo_started = time.perf_counter()
    dpo_history = [{"step": 0, **watch()}] + train_dpo(
        policy, reference, tokenizer, pairs, recipe.dpo_beta, recipe.dpo_lr, recipe.dpo_epochs, recipe.dpo_batch_size,
        recipe.seed, watch, recipe.watch_every)
    dpo_seconds = time.perf_counter() - dpo_started
    score["after DPO"] = scores(policy, tokenizer, heldout, recipe)
    print("dpo", json.dumps(score["after DPO"][str(recipe.score_seeds[0])]["all"]), flush=True)
    dpo_card = {"command": command, "recipe": asdict(recipe), "stage": "dpo", "pairs": len(pairs),
                "scores": dict(score), "history": dpo_history, "train_seconds": round(dpo_seconds, 1),
                "heldout_replies": replies_of(policy, tokenizer, heldout, recipe),
                "wall_seconds": round(time.perf_counter() - started, 1), "machine": machine}
    write_stage(args.out, "dpo", policy, dpo_card, [("pairs.json", pairs)])

    # Stage 2: GRPO, from the DPO model and against it
    reference, policy = frozen_copy(policy), policy_copy(policy)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=recipe.grpo_lr,
                                  weight_decay=0.0)
    prompts = training_instructions(recipe, recipe.grpo_per_task, recipe.seed + 3)
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(recipe.seed + 4)).tolist()
    watch = watcher(policy, reference, tokenizer, watch_set, None, None, recipe, None)
    before_samples = samples_of(policy, tokenizer, watch_set[:2] + watch_set[recipe.watch_prompts:][:2], recipe)
    grpo_history, grpo_started = [{"step": 0, **watch()}], time.perf_counter()
    for step in range(recipe.grpo_steps):
        batch = [prompts[order[(step * recipe.grpo_prompts_per_step + i) % len(prompts)]]
                 for i in range(recipe.grpo_prompts_per_step)]
        record = grpo_step(policy, reference, tokenizer, batch, optimizer, recipe.grpo_group_size, recipe.grpo_beta,
                           recipe.grpo_epsilon, recipe.grpo_iterations, recipe.grpo_loss_type, generator,
                           recipe.max_new_tokens, recipe.grpo_kl_correction)
        grpo_history.append({"step": step + 1, **record})
        if (step + 1) % recipe.watch_every == 0:
            grpo_history[-1].update(watch())
            print(f"grpo step {step + 1}: {json.dumps(grpo_history[-1])} {time.perf_counter() - started:.0f} s",
                  flush=True)
    grpo_seconds = time.perf_counter() - grpo_started
    score["after GRPO"] = scores(policy, tokenizer, heldout, recipe)
    print("grpo", json.dumps(score["after GRPO"][str(recipe.score_seeds[0])]["all"]), flush=True)
    grpo_card = {"command": command, "recipe": asdict(recipe), "stage": "grpo", "scores": score,
                 "history": grpo_history, "train_seconds": round(grpo_seconds, 1),
                 "samples": {"before": before_samples,
                             "after": samples_of(policy, tokenizer, watch_set[:2] + watch_set[recipe.watch_prompts:][:2],
                                                 recipe)},
                 "heldout_replies": replies_of(policy, tokenizer, heldout, recipe),
                 "wall_seconds": round(time.perf_counter() - started, 1), "machine": machine}
    write_stage(args.out, "grpo", policy, grpo_card)
    print(f"wrote {args.out}: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
