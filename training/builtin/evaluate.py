"""Accuracy of a model on freshly generated scene questions, per question type.

    python -m training.builtin.evaluate --model vlserve/builtin_model --n 500 --seed 12345
    python -m training.builtin.evaluate --backend vlserve            # through vlserve's Engine
    python -m training.builtin.evaluate --blank                      # every image replaced by a blank one
    python -m training.builtin.evaluate --kind outside               # pictures with no known shape
    python -m training.builtin.evaluate --kind image --shots 2       # two worked examples before each question
    python -m training.builtin.evaluate --kind typed                 # typed.py: crowded, relations, typed phrasing
    python -m training.builtin.evaluate --set both                   # and the independent set (independent_set.py)

A backend is any `generate_fn(prompts, images) -> answers`: `prompts[i]` is the chat-templated text
with one `<image>` per image (a video is its frames, one `<image>` each) and `images[i]` the PIL images
for it, in order. Decoding is greedy. Answers are scored by vlserve/builtin/answers.py.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Callable

from PIL import Image

from training.builtin import independent_set
from vlserve.builtin import scenes, typed
from vlserve.builtin.answers import is_correct
from vlserve.model.builtin import BUILTIN_MODEL_DIR

GenerateFn = Callable[[list[str], list[list[Image.Image]]], list[str]]

DEFAULT_MODEL = BUILTIN_MODEL_DIR
MAX_NEW_TOKENS = 24
QTYPE_GROUPS = (("image", scenes.IMAGE_QTYPES), ("video", scenes.VIDEO_QTYPES),
                ("outside", (scenes.OUTSIDE_QTYPE,)))
TYPED_GROUPS = (("typed", typed.QTYPES),)
INDEPENDENT_GROUPS = (("independent", independent_set.QTYPES), ("slice", ("crowded", "wide", "tall", "square")),
                      ("slice", tuple(f"{n} shapes" for n in independent_set.NUMBER)))


@dataclass
class Report:
    correct: Counter
    total: Counter
    groups: tuple = QTYPE_GROUPS

    def accuracy(self, qtype: str) -> float:
        return self.correct[qtype] / self.total[qtype] if self.total[qtype] else float("nan")

    def overall(self, qtypes) -> float:
        n = sum(self.total[q] for q in qtypes)
        return sum(self.correct[q] for q in qtypes) / n if n else float("nan")

    def table(self) -> str:
        lines = [f"{'question type':<14} {'accuracy':>8} {'n':>5}"]
        for group, qtypes in self.groups:
            present = [q for q in qtypes if self.total[q]]
            if not present:
                continue
            lines += [f"{q:<14} {self.accuracy(q):>8.1%} {self.total[q]:>5}" for q in present]
            if len(present) > 1 and group != "slice":
                total = sum(self.total[q] for q in present)
                lines.append(f"{group + ' overall':<14} {self.overall(present):>8.1%} {total:>5}")
        return "\n".join(lines)


def prompt_for(question: str, n_images: int, tokenizer) -> str:
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": question}]
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                        add_generation_prompt=True)


def with_shots(samples: list[scenes.Sample], shots: int, seed: int) -> list[scenes.Sample]:
    """Each sample behind `shots` worked examples (another image scene, one of its questions and its
    reference answer, a turn each), as examples/few_shot_qa.py asks: the answer must come from the
    question's own picture, the last one. The shots' pictures come first in `Sample.images`."""
    rng = random.Random(seed)
    out = []
    for s in samples:
        drawn = [scenes.image_scene(rng) for _ in range(shots)]
        worked = [(d.frames, rng.choice(d.qas)) for d in drawn]
        out.append(scenes.Sample([im for frames, _ in worked for im in frames] + s.images, s.question, s.answer,
                                 s.qtype, [(len(frames), qa.question, qa.answer) for frames, qa in worked]))
    return out


def prompt_for_sample(s: scenes.Sample, tokenizer) -> str:
    """The chat-templated prompt: the sample's worked examples (if any), then its question."""
    if not s.shots:
        return prompt_for(s.question, len(s.images), tokenizer)
    messages = []
    for n_images, question, answer in s.shots:
        messages += [{"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": question}]},
                     {"role": "assistant", "content": [{"type": "text", "text": answer}]}]
    own = len(s.images) - sum(n for n, _, _ in s.shots)
    messages.append({"role": "user", "content": [{"type": "image"}] * own + [{"type": "text", "text": s.question}]})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def blank_like(images: list[Image.Image]) -> list[Image.Image]:
    return [Image.new("RGB", im.size, (128, 128, 128)) for im in images]


def evaluate(generate_fn: GenerateFn, samples: list[scenes.Sample], tokenizer, blank: bool = False) -> Report:
    prompts = [prompt_for_sample(s, tokenizer) for s in samples]
    images = [blank_like(s.images) if blank else s.images for s in samples]
    answers = generate_fn(prompts, images)
    correct, total = Counter(), Counter()
    for s, a in zip(samples, answers):
        total[s.qtype] += 1
        correct[s.qtype] += is_correct(s.qtype, a, s.answer)
    return Report(correct, total)


def evaluate_independent(generate_fn: GenerateFn, tokenizer,
                         seeds: tuple[int, ...] = (49,)) -> tuple[Report, list[tuple]]:
    """Accuracy on the independent set (drawn once per seed, pooled) per question type, and per slice
    (crowded pictures, wide, tall and square canvases) as extra rows; also every miss as (item, answer)."""
    items = [it for seed in seeds for it in independent_set.build(seed)]
    answers = generate_fn([prompt_for(it.question, len(it.images), tokenizer) for it in items],
                          [it.images for it in items])
    correct, total, misses = Counter(), Counter(), []
    for it, a in zip(items, answers):
        right = independent_set.is_right(it, a)
        for key in (it.qtype, *it.tags):
            total[key] += 1
            correct[key] += right
        if not right:
            misses.append((it, a))
    return Report(correct, total, INDEPENDENT_GROUPS), misses


# ---------------------------------------------------------------- backends


def transformers_backend(model_dir: str | Path) -> tuple[GenerateFn, object]:
    """Greedy decoding with transformers' LlavaForConditionalGeneration; prompts of equal token length
    are batched together, so no padding (and no question of padding side) is involved."""
    import torch
    from transformers import LlavaForConditionalGeneration, LlavaProcessor

    processor = LlavaProcessor.from_pretrained(model_dir)
    model = LlavaForConditionalGeneration.from_pretrained(model_dir).eval()

    @torch.no_grad()
    def generate(prompts: list[str], images: list[list[Image.Image]]) -> list[str]:
        encoded = [processor(images=im, text=p, return_tensors="pt") for p, im in zip(prompts, images)]
        answers: list[str | None] = [None] * len(prompts)
        order = sorted(range(len(prompts)), key=lambda i: encoded[i]["input_ids"].shape[1])
        for _, group in groupby(order, key=lambda i: encoded[i]["input_ids"].shape[1]):
            group = list(group)
            for start in range(0, len(group), 32):
                idx = group[start: start + 32]
                ids = torch.cat([encoded[i]["input_ids"] for i in idx])
                pixels = torch.cat([encoded[i]["pixel_values"] for i in idx])
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels,
                                     max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
                texts = processor.tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
                for i, t in zip(idx, texts):
                    answers[i] = t
        return answers

    return generate, processor.tokenizer


def vlserve_backend(model_dir: str | Path) -> tuple[GenerateFn, object]:
    """vlserve's offline Engine, given the same prompt text and PIL images."""
    from transformers import AutoTokenizer

    from vlserve import Engine

    engine = Engine(model=str(model_dir))

    def generate(prompts: list[str], images: list[list[Image.Image]]) -> list[str]:
        # In slices no longer than the engine's waiting queue, which refuses a longer batch (EngineBusy).
        step = engine.args.max_waiting_requests
        outs = [o for i in range(0, len(prompts), step)
                for o in engine.generate(prompt=prompts[i:i + step], image_data=images[i:i + step],
                                         sampling_params={"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0})]
        return [o["text"] if isinstance(o, dict) else str(o) for o in outs]

    return generate, AutoTokenizer.from_pretrained(model_dir)


BACKENDS = {"transformers": transformers_backend, "vlserve": vlserve_backend}


def main() -> None:
    p = argparse.ArgumentParser(description="Per-question-type accuracy on generated scenes.")
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--n", type=int, default=500, help="questions per kind (image, video, outside)")
    p.add_argument("--seed", type=int, default=12345, help="held-out seed (training uses small seeds)")
    p.add_argument("--kind", choices=("image", "video", "outside", "all", "typed"), default="all",
                   help="all: image, video and outside; typed: typed.py's questions, its types in equal shares")
    p.add_argument("--backend", choices=tuple(BACKENDS), default="transformers")
    p.add_argument("--blank", action="store_true", help="replace every image by a blank one")
    p.add_argument("--shots", type=int, default=0,
                   help="worked examples (another picture, a question, its answer) before each question")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--set", choices=("generator", "independent", "both"), default="generator",
                   help="the generator's questions (--n, --seed, --kind), the independent set, or both")
    p.add_argument("--show-misses", action="store_true", help="print the independent set's wrong answers")
    p.add_argument("--independent-seed", type=int, nargs="+", default=[49],
                   help="where the independent set places its shapes: 49 is the set the checkpoints were chosen on; "
                        "another seed draws fresh pictures and questions from the same phrasings; several are pooled")
    a = p.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    generate_fn, tokenizer = BACKENDS[a.backend](a.model)
    if a.set != "generator":
        report, misses = evaluate_independent(generate_fn, tokenizer, tuple(a.independent_seed))
        print(f"model {a.model}  backend {a.backend}  independent set, seed {' '.join(map(str, a.independent_seed))} "
              f"({report.overall(independent_set.QTYPES):.1%})")
        print(report.table())
        if a.show_misses:
            for it, answer in misses:
                print(f"  [{it.qtype}] {it.question!r} -> {answer!r} (expected {it.answer!r})")
        if a.set == "independent":
            return
    kinds = ("image", "video", "outside") if a.kind == "all" else (a.kind,)
    data = [s for i, k in enumerate(kinds)
            for s in (typed.samples(a.n, a.seed) if k == "typed" else scenes.samples(a.n, a.seed + i, k))]
    if a.shots:
        data = with_shots(data, a.shots, a.seed + 100)
    report = evaluate(generate_fn, data, tokenizer, blank=a.blank)
    if a.kind == "typed":
        report.groups = TYPED_GROUPS
    print(f"model {a.model}  backend {a.backend}  seed {a.seed}  n {a.n}/kind"
          f"{f'  {a.shots} shots' if a.shots else ''}{'  BLANK images' if a.blank else ''}")
    print(report.table())


if __name__ == "__main__":
    main()
