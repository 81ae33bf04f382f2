import torch, collections, time
from course_lib.finetuning import load_shakespeare_chat, make_instructions, check_reply, chat_reply
from course_lib.training import load_shakespeare, split_by_position
torch.set_num_threads(1)
model, tok = load_shakespeare_chat("cpu")
text = load_shakespeare()
cut = int(len(text) * 0.9)
held = make_instructions(text[cut:], per_task=12, seed=7, exclude=text[:cut])
t = time.time()
stats = collections.defaultdict(list)
for ex in held:
    g = torch.Generator().manual_seed(0)
    rewards = [check_reply(ex, chat_reply(model, tok, ex["instruction"], max_new_tokens=48, temperature=1.0, generator=g)) for _ in range(8)]
    stats[ex["task"]].append(sum(rewards))
for task, counts in stats.items():
    mixed = sum(0 < c < 8 for c in counts)
    print(f"{task:10s} correct of 8 per prompt: {counts}  mixed groups {mixed}/{len(counts)}  mean {sum(counts)/8/len(counts):.2f}")
print(f"{time.time()-t:.0f} s for {len(held)*8} samples")
