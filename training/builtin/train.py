"""Train the built-in LLaVA-format model from scratch on generated scenes, on a CPU.

    python -m training.builtin.train --out DIR --seed 0 --minutes 80          # from scratch
    python -m training.builtin.train --out DIR --init vlserve/builtin_model --minutes 60   # warm start
    python -m training.builtin.train --out DIR --seed 0 --steps N    # a fixed length, fully deterministic

The model is transformers' `LlavaForConditionalGeneration` (CLIP vision tower, two-layer MLP
projector, Llama decoder with grouped-query attention), saved with `save_pretrained`, so the
checkpoint is plain Hugging Face LLaVA format: by default 96 px images in 16 px patches, so 36 tokens
an image and 288 for an 8-frame video (the shipped model, from stage 16: `--image-size 128`, 64 and
512). Training adds four things that are not saved:

- a curriculum: the vision tower and projector first learn the per-patch targets below on their own
  (`--vision-warmup` steps), then the whole model trains on answers plus those targets;
- an auxiliary head on the projector's output that predicts, for every patch, the shape and colour
  under it, the patch's row and column, and which shape (if any) has its visible centre there (one
  mark per shape, so the mean over patches is a count), so the image tokens carry what the questions
  ask about; with `--count-weight`, also each picture's counts read linearly from its mean patch; with
  `--density-weight`, each patch's share of the shapes' mass (a density map whose sum is the count);
- attention supervision (attention_targets.py): two heads of one decoder layer are told which
  patches (and frames) answer the question, and one head of the layer below which question words
  name the thing asked about; this is what taught the decoder to bind a colour to a named shape;
- per-question-type loss weights and sampling priorities that favour the questions binding two facts
  (the colour of a named shape among several, its side of the image, the direction of motion) and
  counting, and two moving shapes for every colour change among the training videos.

Each sequence holds one to four question/answer turns about the same scene, which amortises the
image tokens; the loss covers answer tokens only. What a CPU-second buys (issue 21's budget is 90
minutes on one core, from scratch): the decoder's forward and backward are nine tenths of a step,
and they cost by padded tokens, so an image batch draws one turn count for all its rows (with a
count per row 31% of a batch was padding) and holds more scenes when the count is small (a fixed
number of tokens a step); a video batch asks every question of each video (its 32-128 image tokens
carry four answers, not two and a half) and comes every fourth step instead of every third.
Captions, the type that lagged in every earlier run, weigh and are picked more. The vision warm-up
is 800 steps (0.2 s each; the decoder keeps training the per-patch head afterwards). The train log
records the process's CPU seconds, the checkpoint is written at every evaluation, so a stopped run
leaves its last evaluated state, and `--cpu-minutes` stops a run (and saves it) when its CPU time is
spent. Most prompts end with the chat template's "ASSISTANT: " and the answer follows as its own
tokens (no leading space); RAW_PROMPT_SHARE of them end with a bare "ASSISTANT:" and the answer
carries the space, so raw prompts written by hand still work.

Two flags make a step cheaper without changing what it learns from. `--bf16` runs the forward and
backward passes under bfloat16 autocast, which the AMX units of these Xeons multiply natively (the
weights, the optimizer and the evaluations stay fp32). `--data-worker` draws the batches in a child
process (batch_stream.py), the same batches in the same order, for a run that has a core to spare.

`--init DIR` starts from an earlier checkpoint of the same shape (its depths unless told otherwise;
or another `--image-size`: the vision tower's position table is resampled to the new patch grid; or
more `--vision-layers` / `--text-layers`: the appended layers start as the identity): every weight is
copied, and each token of the new vocabulary starts from the old embedding (and output row) of the
same text, or of the same word with a leading space, or the mean of the old pieces it splits into.
With `--steps` the run is deterministic from its seed; with `--minutes` the step count is fixed
after timing the first steps and written to the log.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    PreTrainedTokenizerFast,
)
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from vlserve.builtin import scenes, typed
from training.builtin.attention_targets import (
    KEYWORD_LAYER, RETRIEVAL_LAYER, AttentionBatch, AttentionTarget, Turn, turn_targets,
)
from training.builtin.batch_stream import BatchStream
from training.builtin.place_targets import PLACE_LAYER, PlaceBatch, PlaceHead, PlaceTarget, turn_places
from training.builtin.tokenizer import BUILTIN_CHAT_TEMPLATE, IMAGE, train_tokenizer
from vlserve.testing.checkpoint_tools import clip_image_processor_kwargs

IMAGE_SIZE = 96  # stages 1-15's input; 64 px (16 tokens) lost small shapes' counts and captions

# Left/right (position, direction) is what lags in every run from scratch: with position 2 and
# direction 3 (and turn priorities 1.5 and 3), a 3,900-step run ended at position 48%, direction 50%;
# with these, the same run (seed, steps) ended at 92% and 100% (run 3's eval logs, recorded in README.md at ba1d303).
QTYPE_WEIGHT = {
    "colour": 1.0, "shape": 1.0, "count": 3.0, "position": 3.5, "exists": 2.0, "caption": 3.0,
    "direction": 4.5, "first_colour": 2.0, "last_colour": 2.0, "appears": 1.0, "event": 2.0,
    scenes.OUTSIDE_QTYPE: 1.0, typed.RELATION_QTYPE: 2.0,
}
MULTI_OBJECT_BOOST = 2.0  # colour/shape of one shape among several: the binding case
# How much likelier a question type is to be among a sequence's turns: direction exists only for
# half of the videos and counting has no attention target, so both would otherwise be rarely seen.
# Captions, yes/no and counting lagged (64-80% where colour and shape reached 96-100%), so they
# are asked more often too.
TURN_PRIORITY = {"direction": 4.0, "count": 2.5, "position": 2.5, "caption": 3.0, "exists": 2.0}
RAW_PROMPT_SHARE = 0.15
# Sequence length, in tokens, of an image scene asked k questions: <s>, 16 image tokens, then about 19
# tokens a turn (prompt and answer). Counted at 64 px; at 96 px an image is 36 tokens, which makes the
# one- and two-turn batches a little longer than the four-turn ones. Left as it was: the shipped
# checkpoint (runs 6 and 7) was trained with these numbers and the recipe reproduces it. An image
# batch draws one k for all its rows and holds batch_images * row_tokens(MAX_TURNS) / row_tokens(k)
# scenes, so every image step costs about the same and no row is mostly padding (with k drawn per row,
# 31% of a batch was padding).
MAX_TURNS = 4
IMAGE_ROW_BASE, IMAGE_ROW_PER_TURN = 17, 19
# Pictures a few-shot row holds (one question each, in its own turn). Run 6 never saw two pictures in
# one prompt, and in examples/few_shot_qa.py answered about the first shot's picture instead of the
# last; a fourth stage with these rows teaches a turn's answer to look at that turn's picture.
MULTI_SCENES = (2, 3)
OUTSIDE_SHARE = 0.12  # of the scenes in an image batch: pictures with no known shape


@dataclass
class TrainArgs:
    out: str
    seed: int = 0
    steps: int | None = None
    minutes: float | None = None
    batch_images: int = 24  # scenes in an image batch of MAX_TURNS turns each; more with fewer turns
    batch_videos: int = 12
    video_every: int = 4  # one video batch after every (video_every - 1) image batches
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 150
    aux_weight: float = 1.0
    count_weight: float = 0.0
    density_weight: float = 0.0  # of the per-patch density read-out (AuxHead.density_loss); 0: not trained
    attn_weight: float = 1.0
    place_weight: float = 0.0  # of the relation place read-out's loss (place_targets.py); 0: not trained
    threads: int = 1  # on a shared 2-core machine, 2 threads ran 10x slower than 1 (oversubscription)
    eval_every: int = 500
    vision_warmup: int = 800  # aux-only steps on vision tower + projector before the decoder joins
    patch: int = 16
    image_size: int = IMAGE_SIZE  # side of the processor's crop; (image_size // patch)² tokens an image
    text_layers: int | None = None  # None: the --init checkpoint's depth, or 4 from scratch
    vision_layers: int | None = None
    init: str | None = None  # an earlier checkpoint to start from
    cpu_minutes: float | None = None  # stop (and save) once the process has used this much CPU time
    stop_after: int | None = None  # stop (and save) after this many steps of the `steps` schedule
    qtype_weight: dict[str, float] = field(default_factory=dict)  # overrides of QTYPE_WEIGHT
    turn_priority: dict[str, float] = field(default_factory=dict)  # overrides of TURN_PRIORITY
    multi_scene_share: float = 0.0  # of the image batches: few-shot rows, a new picture every turn
    typed_share: float = 0.0  # of the scenes: typed.py's (crowded, relations, out-of-world questions, typed phrasing)
    crowded_share: float = typed.CROWDED_SHARE  # of typed.py's drawn pictures: CROWDED_COUNTS smaller shapes
    crowded_counts: tuple[int, ...] = typed.CROWDED_COUNTS  # how many shapes a crowded picture has
    crowded_repeat_share: float = typed.CROWDED_REPEAT_SHARE  # of crowded pictures: colours drawn with repeats
    plain_repeat_share: float = typed.PLAIN_REPEAT_SHARE  # of typed.py's other pictures: the same
    size_ratio: float = typed.SIZE_RATIO  # the area ratio from which typed.py asks for the biggest / smallest
    bf16: bool = False  # forward and backward under bfloat16 autocast (AMX); weights and optimizer stay fp32
    data_worker: bool = False  # draw batches in a child process (batch_stream.py), a few steps ahead

    @property
    def picture_mix(self) -> typed.PictureMix:
        return typed.PictureMix(self.crowded_share, self.crowded_counts, self.crowded_repeat_share,
                                self.plain_repeat_share)


# ---------------------------------------------------------------- model and processor


def build_model(tokenizer: PreTrainedTokenizerFast, patch: int = 16, text_layers: int = 4,
                image_size: int = IMAGE_SIZE, vision_layers: int = 4) -> LlavaForConditionalGeneration:
    vision = CLIPVisionConfig(
        hidden_size=128, intermediate_size=512, num_hidden_layers=vision_layers, num_attention_heads=4,
        image_size=image_size, patch_size=patch, projection_dim=128,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=192, intermediate_size=512, num_hidden_layers=text_layers,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    config = LlavaConfig(
        vision_config=vision, text_config=text,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE),
        projector_hidden_act="gelu", vision_feature_select_strategy="default",
        vision_feature_layer=-1, image_seq_length=(image_size // patch) ** 2, tie_word_embeddings=False,
    )
    config.bos_token_id, config.eos_token_id, config.pad_token_id = (
        tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    return LlavaForConditionalGeneration(config)


def checkpoint_depths(checkpoint: Path) -> tuple[int, int]:
    """(decoder layers, vision tower layers) of a saved checkpoint."""
    config = json.loads((checkpoint / "config.json").read_text())
    return config["text_config"]["num_hidden_layers"], config["vision_config"]["num_hidden_layers"]


def build_image_processor(image_size: int = IMAGE_SIZE) -> CLIPImageProcessorPil:
    return CLIPImageProcessorPil(**clip_image_processor_kwargs(image_size))


def save_checkpoint(model, tokenizer, image_processor, out: Path, logs: list[Path] = ()) -> None:
    """Write to a sibling temp dir, then swap it in, so `out` never holds half a checkpoint."""
    from transformers import LlavaProcessor

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    processor = LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=model.config.vision_config.patch_size,
        vision_feature_select_strategy="default", num_additional_image_tokens=1,
        image_token=IMAGE, chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(tmp)
    image_processor.save_pretrained(tmp)  # preprocessor_config.json, for loaders that read it alone
    tokenizer.save_pretrained(tmp)
    # transformers 5 writes its internal class name; older releases only know PreTrainedTokenizerFast.
    cfg_path = tmp / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    for loaded_only in ("is_local", "local_files_only"):  # set when a warm start loaded the tokenizer
        cfg.pop(loaded_only, None)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    for log in logs:
        if log.exists():
            shutil.copy(log, tmp / log.name)
    if out.exists():
        old = out.with_name(out.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old)
    else:
        tmp.rename(out)


def load_tokenizer(checkpoint: Path) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast.from_pretrained(checkpoint)
    tok.chat_template = BUILTIN_CHAT_TEMPLATE
    return tok


def warm_start(model, tokenizer, init: Path) -> None:
    """Copy an earlier checkpoint of the same shape, or a shallower one, into `model`; rows of the
    (possibly new) vocabulary start from the old rows of the same text (see the module docstring), and
    layers past the checkpoint's depth start as the identity (grown_layers)."""
    from transformers import AutoTokenizer

    old = LlavaForConditionalGeneration.from_pretrained(init)
    old_tok = AutoTokenizer.from_pretrained(init)
    vocab_keys = {"model.language_model.embed_tokens.weight", "lm_head.weight"}
    state = {k: v for k, v in old.state_dict().items() if k not in vocab_keys}
    pos_key = "model.vision_tower.embeddings.position_embedding.weight"
    want = model.state_dict()[pos_key].shape[0]
    if state[pos_key].shape[0] != want:
        state[pos_key] = resized_position_embedding(state[pos_key], math.isqrt(want - 1))
    missing, unexpected = model.load_state_dict(state, strict=False)
    grown = grown_layers(model, set(missing) - vocab_keys)
    assert set(missing) == vocab_keys | grown and not unexpected, (missing, unexpected)
    old_vocab = old_tok.get_vocab()
    rows = []
    for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        if token in old_vocab:
            rows.append([old_vocab[token]])
        elif "\u0120" + token in old_vocab:  # "red" starts from " red"
            rows.append([old_vocab["\u0120" + token]])
        else:
            text = tokenizer.convert_tokens_to_string([token])
            rows.append(old_tok(text, add_special_tokens=False).input_ids or [old_tok.pad_token_id])
    with torch.no_grad():
        for name, new_w, old_w in (("embed", model.get_input_embeddings().weight, old.get_input_embeddings().weight),
                                   ("head", model.lm_head.weight, old.lm_head.weight)):
            for i, ids in enumerate(rows):
                new_w[i] = old_w[ids].mean(0)


# The projections that write a layer's two residual branches back: zero, the layer adds nothing.
RESIDUAL_OUTPUTS = ("self_attn.out_proj.", "mlp.fc2.", "self_attn.o_proj.", "mlp.down_proj.")


def grown_layers(model, missing: set[str]) -> set[str]:
    """The keys among `missing` that belong to a layer appended past the checkpoint's depth (a whole
    layer missing, of the vision tower or the decoder). Their residual outputs are zeroed, so every such
    layer starts as the identity and the grown model computes what the checkpoint did."""
    by_layer: dict[str, set[str]] = {}
    for key in missing:
        if layer := re.match(r".*\.layers\.\d+\.", key):
            by_layer.setdefault(layer.group(0), set()).add(key)
    state = model.state_dict()
    grown = set()
    for layer, keys in by_layer.items():
        if keys == {k for k in state if k.startswith(layer)}:
            grown |= keys
            with torch.no_grad():
                for key in keys:
                    if key[len(layer):].startswith(RESIDUAL_OUTPUTS):
                        state[key].zero_()
    return grown


def resized_position_embedding(table: torch.Tensor, grid: int) -> torch.Tensor:
    """A CLIP position table ([1 + g², d]: the class token's row, then the patch grid's rows) for a
    grid x grid picture: the class row as it was, the patch rows bicubically resampled as an image."""
    old_grid = math.isqrt(table.shape[0] - 1)
    patches = table[1:].T.reshape(1, -1, old_grid, old_grid)
    resized = F.interpolate(patches, size=(grid, grid), mode="bicubic", align_corners=False)
    return torch.cat([table[:1], resized.reshape(table.shape[1], grid * grid).T])


# ---------------------------------------------------------------- batches


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    target_weight: torch.Tensor  # [B, T] weight of predicting input_ids[:, t] (0 = not a target)
    pixel_values: torch.Tensor  # [n_images, 3, H, W], in order of their <image> runs
    patch_targets: torch.Tensor  # [n_images, grid*grid, 6]: shape, colour, row, col, centre's shape, mass
    qtypes: list[list[tuple[str, int, int]]]  # per sequence: (qtype, start, end) of each answer span
    attention: AttentionBatch
    places: PlaceBatch


def centre_patch(x: float, y: float, grid: int, marked: np.ndarray) -> int:
    """The patch holding the point (x, y), or, when another shape's centre already marks it, the
    unmarked patch nearest the point: every shape keeps its own mark, so the marks count the shapes."""
    rows, cols = np.divmod(np.arange(grid * grid), grid)
    distance = ((cols + 0.5) / grid - x) ** 2 + ((rows + 0.5) / grid - y) ** 2
    return int(np.where(marked > 0, np.inf, distance).argmin())


MASS_UNIT = 1000  # patch_targets' mass column: thousandths of a shape


def patch_masses(pixels: np.ndarray) -> np.ndarray:
    """From each object's visible pixels per patch ([patches, objects]), the share of each object that
    lies in a patch, summed over the objects and in MASS_UNITs: a density map whose sum over the
    patches is the number of (visible) shapes."""
    seen = pixels.sum(0)
    shares = pixels[:, seen > 0] / seen[seen > 0]
    return np.rint(shares.sum(1) * MASS_UNIT).astype(np.int64)


def patch_targets(scene: scenes.Scene, grid: int) -> np.ndarray:
    """Per frame and patch: (shape id, colour id, row, col, shape id of the object whose visible
    centre is in the patch, or nearest it when two centres share a patch, the shapes' mass in it);
    ids 0 = background / none."""
    rows, cols = np.divmod(np.arange(grid * grid), grid)
    out = []
    for mask, objects in zip(scene.masks, scene.objects):
        blocks = scenes.patch_blocks(mask, grid)
        counts = np.stack([(blocks == k).sum(1) for k in range(len(objects) + 1)], axis=1)
        mass = patch_masses(counts[:, 1:])
        counts[:, 0] = 0
        owner = counts.argmax(1)
        owner[counts.max(1) < blocks.shape[1] // 16] = 0
        shape_id = np.array([0] + [scenes.SHAPES.index(o.shape) + 1 for o in objects])[owner]
        colour_id = np.array([0] + [list(scenes.COLOURS).index(o.colour) + 1 for o in objects])[owner]
        centre = np.zeros(grid * grid, dtype=np.int64)
        for o, (x, y) in zip(objects, scenes.centroids(mask, len(objects))):
            centre[centre_patch(x, y, grid, centre)] = scenes.SHAPES.index(o.shape) + 1
        out.append(np.stack([shape_id, colour_id, rows, cols, centre, mass], axis=1))
    return np.stack(out)


class BatchMaker:
    def __init__(self, tokenizer, image_processor, seed: int, grid: int,
                 qtype_weight: dict[str, float] | None = None, turn_priority: dict[str, float] | None = None):
        self.tok, self.proc, self.grid = tokenizer, image_processor, grid
        self.rng = random.Random(seed)
        self.qtype_weight = {**QTYPE_WEIGHT, **(qtype_weight or {})}
        self.turn_priority = {**TURN_PRIORITY, **(turn_priority or {})}
        self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE)

    def encode(self, scene: scenes.Scene, qas: list[scenes.QA]):
        """One conversation about one scene: its images open the first turn."""
        return self.encode_turns([(scene, qa) for qa in qas])

    def encode_turns(self, turns: list[tuple[scenes.Scene, scenes.QA]]):
        """One conversation whose turns may each bring a new scene: a turn whose scene differs from
        the turn before opens with that scene's images (a few-shot prompt: one picture a turn), and
        its answer and attention targets are about that scene's own image tokens."""
        ids: list[int] = []
        weights: list[float] = []
        spans = []
        targets: list[AttentionTarget] = []
        places: list[PlaceTarget] = []
        image_positions: list[int] = []
        previous = None
        for i, (scene, qa) in enumerate(turns):
            new_scene = scene is not previous
            previous = scene
            images = [{"type": "image"}] * len(scene.frames) if new_scene else []
            msgs = [{"role": "user", "content": images + [{"type": "text", "text": qa.question}]}]
            prompt = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            if i > 0:
                prompt = prompt[len(self.tok.bos_token):]
            prefix = ""
            if self.rng.random() < RAW_PROMPT_SHARE and prompt.endswith(" "):
                prompt, prefix = prompt[:-1], " "  # a hand-written "... ASSISTANT:" prompt
            enc = self.tok(prompt, add_special_tokens=False, return_offsets_mapping=True)
            p_ids, p_offsets = self._expand_images(enc.input_ids, enc.offset_mapping)
            if new_scene:
                image_positions = [len(ids) + pos for pos, t in enumerate(p_ids) if t == self.image_token_id]
            a_enc = self.tok(prefix + qa.answer + self.tok.eos_token, add_special_tokens=False,
                             return_offsets_mapping=True)
            a_ids = a_enc.input_ids
            w = self.qtype_weight[qa.qtype]
            if qa.qtype in ("colour", "shape") and len(scene.objects[0]) > 1:
                w *= MULTI_OBJECT_BOOST
            turn = Turn(prompt, p_offsets, len(ids), a_enc.offset_mapping, len(ids) + len(p_ids), prefix)
            targets += turn_targets(scene, qa, turn, image_positions, self.grid)
            places += turn_places(scene, qa, turn.answer_start - 1)
            ids += p_ids
            weights += [0.0] * len(p_ids)
            spans.append((qa.qtype, turn.answer_start, turn.answer_start + len(a_ids)))
            ids += a_ids
            weights += [w] * len(a_ids)
        return ids, weights, spans, targets, places

    def _expand_images(self, ids: list[int], offsets: list[tuple[int, int]]):
        """Each <image> becomes grid² image tokens, as the processor expands it; offsets follow."""
        out, out_offsets = [], []
        for t, o in zip(ids, offsets):
            k = self.grid ** 2 if t == self.image_token_id else 1
            out += [t] * k
            out_offsets += [o] * k
        return out, out_offsets

    def make(self, scene_list: list[scenes.Scene], max_turns: int = 4, priority: bool = True,
             turns: int | None = None) -> Batch:
        """One sequence per scene with 1..max_turns turns each, or exactly `turns` (at most all of a
        scene's questions) for every sequence, so that the rows are of a length and pad little."""
        rows, frames, targets, spans_all, attn_all, places_all = [], [], [], [], [], []
        for scene in scene_list:
            qas = self.pick_turns(scene.qas, turns or self.rng.randint(1, max_turns), priority)
            ids, w, spans, attn, places = self.encode(scene, qas)
            rows.append((ids, w))
            spans_all.append(spans)
            attn_all.append(attn)
            places_all.append(places)
            frames += scene.frames
            targets.append(patch_targets(scene, self.grid))
        return self.collate(rows, frames, np.concatenate(targets), spans_all, attn_all, places_all)

    def make_multi(self, conversations: list[list[scenes.Scene]], priority: bool = True) -> Batch:
        """One sequence per list of scenes, one question about each scene in its own turn (a picture a
        turn, as a few-shot prompt has them)."""
        return self.make_turns([[(scene, self.pick_turns(scene.qas, 1, priority)[0]) for scene in scene_list]
                                for scene_list in conversations])

    def make_turns(self, conversations: list[list[tuple[scenes.Scene, scenes.QA]]]) -> Batch:
        """One sequence per list of (scene, question) turns, as `encode_turns` lays them out."""
        rows, frames, targets, spans_all, attn_all, places_all = [], [], [], [], [], []
        for turns in conversations:
            ids, w, spans, attn, places = self.encode_turns(turns)
            rows.append((ids, w))
            spans_all.append(spans)
            attn_all.append(attn)
            places_all.append(places)
            previous = None
            for scene, _ in turns:
                if scene is not previous:  # a turn about the same scene brings no new images
                    frames += scene.frames
                    targets.append(patch_targets(scene, self.grid))
                previous = scene
        return self.collate(rows, frames, np.concatenate(targets), spans_all, attn_all, places_all)

    def pick_turns(self, qas: list[scenes.QA], k: int, priority: bool) -> list[scenes.QA]:
        """k questions in random order, drawn without replacement with TURN_PRIORITY weights
        (Efraimidis-Spirakis: the k largest u ** (1 / weight)), or uniformly without `priority`."""
        weight = lambda qa: self.turn_priority.get(qa.qtype, 1.0) if priority else 1.0  # noqa: E731
        keys = [self.rng.random() ** (1 / weight(qa)) for qa in qas]
        order = sorted(range(len(qas)), key=lambda i: -keys[i])
        return [qas[i] for i in order[:k]]

    def collate(self, rows, frames, targets, spans_all, attn_all, places_all) -> Batch:
        T = max(len(ids) for ids, _ in rows)
        pad = self.tok.pad_token_id
        input_ids = torch.full((len(rows), T), pad, dtype=torch.long)
        attn = torch.zeros((len(rows), T), dtype=torch.long)
        weight = torch.zeros((len(rows), T))
        for i, (ids, w) in enumerate(rows):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            attn[i, : len(ids)] = 1
            weight[i, : len(ids)] = torch.tensor(w)
        pixels = self.proc(frames, return_tensors="pt")["pixel_values"]
        return Batch(input_ids, attn, weight, pixels, torch.from_numpy(targets).long(), spans_all,
                     AttentionBatch.build(attn_all, T), PlaceBatch.build(places_all))


# ---------------------------------------------------------------- forward


def picture_counts(targets: torch.Tensor) -> torch.Tensor:
    """[n_images, 1 + kinds]: each picture's shapes, all and of each kind, from patch_targets' centre
    marks (one a shape)."""
    marks = targets[..., 4]
    kinds = range(1, len(scenes.SHAPES) + 1)
    return torch.stack([(marks > 0).sum(-1)] + [(marks == k).sum(-1) for k in kinds], dim=-1).float()


class AuxHead(nn.Module):
    """Training-only: per-patch shape / colour / row / column / centre mark from the projector's output
    and, with a `count_weight`, each picture's counts (all its shapes, and each kind) read linearly
    from the mean of its patches, which is what a decoder head that looks at every patch alike gets;
    with a `density_weight`, each patch's mass (patch_masses) read linearly from that patch, so that a
    head looking at every patch alike reads the count as a sum of per-patch parts."""

    def __init__(self, hidden: int, grid: int, count_weight: float = 0.0, density_weight: float = 0.0):
        super().__init__()
        self.sizes = (len(scenes.SHAPES) + 1, len(scenes.COLOURS) + 1, grid, grid, len(scenes.SHAPES) + 1)
        self.proj = nn.Linear(hidden, sum(self.sizes))
        # made only when trained, so that a recipe without it draws the same random numbers as before
        self.count_weight = count_weight
        self.count = nn.Linear(hidden, 1 + len(scenes.SHAPES)) if count_weight else None
        self.density_weight = density_weight
        self.density = nn.Linear(hidden, 1) if density_weight else None

    def count_loss(self, feats: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Huber loss of the counts read from the mean patch."""
        return F.smooth_l1_loss(self.count(feats.mean(1)), picture_counts(targets))

    def density_loss(self, feats: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Squared error of the per-patch masses, summed over a picture's patches, plus that of their
        sum (the count), averaged over the pictures."""
        pred, mass = self.density(feats).squeeze(-1), targets[..., 5].float() / MASS_UNIT
        return ((pred - mass) ** 2).sum(-1).mean() + ((pred.sum(-1) - mass.sum(-1)) ** 2).mean()

    def density_counts(self, feats: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per picture, whether its summed density read-out rounds to its number of shapes."""
        return self.density(feats).squeeze(-1).sum(-1).round() == picture_counts(targets)[:, 0]

    def loss(self, feats: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.proj(feats).split(self.sizes, dim=-1)
        # Most patches are background; weight object patches up so shape is learned, not just "empty".
        w = torch.where(targets[..., 0] > 0, 1.0, 0.2).reshape(-1)
        w_centre = torch.where(targets[..., 4] > 0, 1.0, 0.1).reshape(-1)  # centres are rarer still
        total = 0.0
        for i, head_logits in enumerate(logits):
            ce = F.cross_entropy(head_logits.reshape(-1, head_logits.shape[-1]), targets[..., i].reshape(-1),
                                 reduction="none")
            wi = w if i < 2 else w_centre if i == 4 else None
            total = total + ((ce * wi).sum() / wi.sum() if wi is not None else 0.5 * ce.mean())
        if self.count is not None:
            total = total + self.count_weight * self.count_loss(feats, targets)
        if self.density is not None:
            total = total + self.density_weight * self.density_loss(feats, targets)
        return total


def image_features(model, pixel_values: torch.Tensor) -> torch.Tensor:
    """Projector output, [n_images, tokens_per_image, hidden], exactly as LLaVA computes it."""
    feats = model.model.get_image_features(
        pixel_values=pixel_values,
        vision_feature_layer=model.config.vision_feature_layer,
        vision_feature_select_strategy=model.config.vision_feature_select_strategy,
    ).pooler_output
    return torch.stack(list(feats))


SUPERVISED_LAYERS = (KEYWORD_LAYER, RETRIEVAL_LAYER)


def forward(model, batch: Batch, keep_attention: bool = False):
    """Answer-token logits (only where target_weight > 0), the projected image features and, with
    `keep_attention`, the attention probabilities of the supervised layers (needs eager attention) and
    the residual after PLACE_LAYER (under key "places")."""
    inner = model.model
    feats = image_features(model, batch.pixel_values)
    embeds = inner.get_input_embeddings()(batch.input_ids)
    is_image = (batch.input_ids == model.config.image_token_id).unsqueeze(-1)
    embeds = embeds.masked_scatter(is_image, feats.reshape(-1, feats.shape[-1]).to(embeds.dtype))
    attentions: dict[int, torch.Tensor] = {}
    hooks = []
    if keep_attention:
        for layer in SUPERVISED_LAYERS:
            module = inner.language_model.layers[layer].self_attn
            hooks.append(module.register_forward_hook(
                lambda _m, _in, out, layer=layer: attentions.__setitem__(layer, out[1])))
        hooks.append(inner.language_model.layers[PLACE_LAYER].register_forward_hook(
            lambda _m, _in, out: attentions.__setitem__("places", out[0] if isinstance(out, tuple) else out)))
    try:
        hidden = inner.language_model(inputs_embeds=embeds, attention_mask=batch.attention_mask).last_hidden_state
    finally:
        for h in hooks:
            h.remove()
    predict = batch.target_weight[:, 1:] > 0  # position t-1 predicts token t
    logits = model.lm_head(hidden[:, :-1][predict])
    return logits, predict, feats, attentions


def losses(model, aux: AuxHead, place_head: PlaceHead | None, batch: Batch):
    """(answer loss, per-patch auxiliary loss, attention supervision loss, relation place loss)."""
    logits, predict, feats, attentions = forward(model, batch, keep_attention=True)
    targets = batch.input_ids[:, 1:][predict]
    w = batch.target_weight[:, 1:][predict]
    lm = (F.cross_entropy(logits, targets, reduction="none") * w).sum() / w.sum()
    hidden = attentions.pop("places")
    places = batch.places.loss(hidden, place_head) if place_head is not None else hidden.new_zeros(())
    return lm, aux.loss(feats, batch.patch_targets), batch.attention.loss(attentions), places


@torch.no_grad()
def answer_accuracy(model, batch: Batch) -> dict[str, tuple[int, int]]:
    """Exact-match accuracy per question type under teacher forcing: an answer counts only when every
    answer token (and the closing </s>) is the argmax, which is exactly when greedy decoding emits it."""
    logits, predict, _, _ = forward(model, batch)
    correct_tok = torch.zeros_like(predict)
    correct_tok[predict] = logits.argmax(-1) == batch.input_ids[:, 1:][predict]
    tally: dict[str, list[int]] = {}
    for i, spans in enumerate(batch.qtypes):
        for qtype, start, end in spans:
            ok = bool(correct_tok[i, start - 1: end - 1].all())
            t = tally.setdefault(qtype, [0, 0])
            t[0] += ok
            t[1] += 1
    return {k: (v[0], v[1]) for k, v in tally.items()}


# ---------------------------------------------------------------- loop


def lr_at(step: int, total: int, args: TrainArgs) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def eval_batches(maker: BatchMaker, seed: int, n_images: int = 200, n_videos: int = 120,
                 n_outside: int = 30, n_typed: int = 0) -> list[Batch]:
    """Held-out single-question batches (a seed the training stream never uses); `n_typed` typed
    scenes (typed.py) are logged as "typed_<qtype>"."""
    rng = random.Random(seed)
    out = []
    typed_rng = random.Random(seed + 1)
    for i in range(0, n_typed, 50):
        batch = maker.make([typed.typed_scene(typed_rng) for _ in range(min(50, n_typed - i))], max_turns=1,
                           priority=False)
        batch.qtypes = [[("typed_" + q, a, b) for q, a, b in spans] for spans in batch.qtypes]
        out.append(batch)
    image_scenes = [scenes.image_scene(rng) for _ in range(n_images)]
    for i in range(0, n_images, 50):
        out.append(maker.make(image_scenes[i: i + 50], max_turns=1, priority=False))
    out.append(maker.make([scenes.outside_scene(rng) for _ in range(n_outside)], max_turns=1, priority=False))
    for n_frames in (4, 8):
        vids = [scenes.video_scene(rng, n_frames) for _ in range(n_videos // 2)]
        for i in range(0, len(vids), 30):
            out.append(maker.make(vids[i: i + 30], max_turns=1, priority=False))
    return out


@torch.no_grad()
def aux_accuracy(model, aux: AuxHead, batch: Batch) -> dict[str, tuple[int, int]]:
    """How well the projector's output encodes each patch target (shape/colour on object patches)."""
    _, _, feats, _ = forward(model, batch)
    preds = [head_logits.argmax(-1) for head_logits in aux.proj(feats).split(aux.sizes, dim=-1)]
    on_object = batch.patch_targets[..., 0] > 0
    out = {}
    for i, name in enumerate(("aux_shape", "aux_colour", "aux_row", "aux_col", "aux_centre")):
        hit = preds[i] == batch.patch_targets[..., i]
        sel = on_object if i < 2 else torch.ones_like(on_object)
        out[name] = (int(hit[sel].sum()), int(sel.sum()))
    if aux.density is not None:  # pictures whose summed density rounds to their number of shapes
        counted = aux.density_counts(feats, batch.patch_targets)
        out["aux_density"] = (int(counted.sum()), counted.numel())
    return out


def evaluate_batches(model, batches: list[Batch], aux: AuxHead | None = None) -> dict[str, float]:
    model.eval()
    tally: dict[str, list[int]] = {}
    for b in batches:
        counts = answer_accuracy(model, b)
        if aux is not None:
            counts |= aux_accuracy(model, aux, b)
        for k, (c, n) in counts.items():
            t = tally.setdefault(k, [0, 0])
            t[0] += c
            t[1] += n
    model.train()
    return {k: c / n for k, (c, n) in sorted(tally.items())}


def image_or_outside(rng: random.Random, typed_share: float = 0.0, mix: typed.PictureMix = typed.PictureMix(),
                     size_ratio: float = typed.SIZE_RATIO) -> scenes.Scene:
    if typed_share and rng.random() < typed_share:  # no draw at 0: the plain recipe's stream is unchanged
        if rng.random() < OUTSIDE_SHARE:
            return typed.typed_outside_scene(rng)
        return typed.typed_scene(rng, mix, size_ratio)
    return scenes.outside_scene(rng) if rng.random() < OUTSIDE_SHARE else scenes.image_scene(rng)


def a_video(rng: random.Random, n_frames: int, typed_share: float = 0.0) -> scenes.Scene:
    if typed_share and rng.random() < typed_share:
        return typed.typed_video_scene(rng, n_frames)
    return scenes.video_scene(rng, n_frames)


def vision_warmup(model, aux: AuxHead, maker: BatchMaker, args: TrainArgs, rng: random.Random) -> None:
    """Curriculum stage 1: teach the vision tower and projector the per-patch targets alone. With the
    answer loss from the start, its large noisy gradient drowns the auxiliary one and shape is learned
    far more slowly (pilots: 40% vs 87% per-patch shape accuracy after a few hundred steps)."""
    if args.vision_warmup <= 0:
        return
    params = [*model.model.vision_tower.parameters(), *model.model.multi_modal_projector.parameters(),
              *aux.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    for step in tqdm(range(args.vision_warmup), desc="vision warm-up", dynamic_ncols=True):
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, (step + 1) / 100)
        sc = [image_or_outside(rng) for _ in range(32)]
        pixels = maker.proc([s.frames[0] for s in sc], return_tensors="pt")["pixel_values"]
        targets = torch.from_numpy(np.concatenate([patch_targets(s, maker.grid) for s in sc])).long()
        loss = aux.loss(image_features(model, pixels), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()


@torch.no_grad()
def fit_density_head(model, aux: AuxHead, processor, grid: int, args: TrainArgs, n_pictures: int = 384) -> float:
    """Fit a warm start's density read-out to the checkpoint's own features (ridge regression on
    pictures from the run's mix, drawn from their own stream) and freeze it: the features then learn to
    carry the density along the direction where they already carry most of it, instead of following a
    read-out that Adam's first, full-size steps would throw far off. Returns the share of those
    pictures whose summed density rounds to their number of shapes."""
    rng = random.Random(args.seed + 20_000)
    sc = [image_or_outside(rng, args.typed_share, args.picture_mix, args.size_ratio) for _ in range(n_pictures)]
    model.eval()
    feats = torch.cat([image_features(model, processor([s.frames[0] for s in sc[i: i + 64]],
                                                       return_tensors="pt")["pixel_values"])
                       for i in range(0, n_pictures, 64)])
    model.train()
    targets = torch.from_numpy(np.concatenate([patch_targets(s, grid) for s in sc])).long()
    x = torch.cat([feats.reshape(-1, feats.shape[-1]), torch.ones(feats.shape[0] * feats.shape[1], 1)], 1).double()
    y = (targets[..., 5].float() / MASS_UNIT).reshape(-1, 1).double()
    ridge = 1e-3 * x.pow(2).sum() / x.shape[1] * torch.eye(x.shape[1], dtype=torch.float64)
    w = torch.linalg.solve(x.T @ x + ridge, x.T @ y).float()
    aux.density.weight.copy_(w[:-1].T)
    aux.density.bias.copy_(w[-1])
    aux.density.requires_grad_(False)
    return aux.density_counts(feats, targets).float().mean().item()


def train(args: TrainArgs) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log_dir = out.with_name(out.name + ".training")  # logs move into the checkpoint when it is saved
    log_dir.mkdir(exist_ok=True)

    # A warm start keeps its checkpoint's tokenizer (every row carries over as it was trained); new
    # phrasings split into the pieces it has.
    tokenizer = load_tokenizer(Path(args.init)) if args.init else train_tokenizer(seed=args.seed)
    processor = build_image_processor(args.image_size)
    text_layers, vision_layers = checkpoint_depths(Path(args.init)) if args.init else (4, 4)
    model = build_model(tokenizer, args.patch, args.text_layers or text_layers, args.image_size,
                        args.vision_layers or vision_layers)
    if args.init:
        warm_start(model, tokenizer, Path(args.init))
    model.set_attn_implementation("eager")  # attention probabilities for the supervision loss
    model.train()
    grid = args.image_size // args.patch
    aux = AuxHead(model.config.text_config.hidden_size, grid, args.count_weight, args.density_weight)
    if aux.density is not None and args.init:
        share = fit_density_head(model, aux, processor, grid, args)
        print(f"[train] density read-out fitted to {args.init}: {share:.1%} of pictures counted by its sum")
    # made only when trained, so that a recipe without it draws the same random numbers as before
    place_head = PlaceHead(model.config.text_config.hidden_size) if args.place_weight else None
    params = list(model.parameters()) + list(aux.parameters()) + list(place_head.parameters() if place_head else [])
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98))
    maker = BatchMaker(tokenizer, processor, args.seed, grid, args.qtype_weight, args.turn_priority)
    held_out = eval_batches(maker, seed=args.seed + 10_000, n_typed=200 if args.typed_share else 0)
    data_rng = random.Random(args.seed)

    def a_picture() -> scenes.Scene:
        return image_or_outside(data_rng, args.typed_share, args.picture_mix, args.size_ratio)

    def next_batch(step: int) -> Batch:
        if step % args.video_every == args.video_every - 1:
            # Every question of a video (about four) in one sequence: 32-128 image tokens carry
            # four answers instead of two and a half.
            n_frames = data_rng.randint(4, 8)
            return maker.make([a_video(data_rng, n_frames, args.typed_share) for _ in range(args.batch_videos)],
                              turns=MAX_TURNS)
        def rows_of(row_tokens: int) -> int:  # as many rows as make a batch of MAX_TURNS-turn rows' tokens
            return round(args.batch_images * (IMAGE_ROW_BASE + MAX_TURNS * IMAGE_ROW_PER_TURN) / row_tokens)

        if data_rng.random() < args.multi_scene_share:
            k = data_rng.choice(MULTI_SCENES)  # k pictures, one turn each
            n = rows_of(k * (IMAGE_ROW_BASE + IMAGE_ROW_PER_TURN))
            return maker.make_multi([[a_picture() for _ in range(k)] for _ in range(n)])
        k = data_rng.randint(1, MAX_TURNS)
        rows = rows_of(IMAGE_ROW_BASE + k * IMAGE_ROW_PER_TURN)
        return maker.make([a_picture() for _ in range(rows)], turns=k)

    vision_warmup(model, aux, maker, args, random.Random(args.seed + 1))
    # the child is a daemon: should the loop raise, it ends with this process
    stream = BatchStream(next_batch).start() if args.data_worker else None
    batch_at = stream.next if stream else next_batch
    helper_cpu_seconds = stream.cpu_seconds if stream else lambda: 0.0
    n_params = sum(p.numel() for p in model.parameters())
    total = args.steps or 10 ** 9
    log_path = log_dir / "train_log.csv"
    eval_path = log_dir / "eval_log.csv"
    with open(log_path, "w", newline="") as f:
        csv.writer(f).writerow(["step", "seconds", "cpu_seconds", "lr", "lm_loss", "aux_loss", "attn_loss",
                                "place_loss"])
    start = time.time()
    paced = (0, 0.0)  # (step, seconds) where the pace was last measured
    bar = tqdm(total=args.steps, desc=f"train {n_params / 1e6:.2f}M params", dynamic_ncols=True)
    step = 0
    while step < total:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, args)
        batch = batch_at(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            lm, aux_loss, attn_loss, place_loss = losses(model, aux, place_head, batch)
            loss = lm + args.aux_weight * aux_loss + args.attn_weight * attn_loss + args.place_weight * place_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        elapsed = time.time() - start
        cpu_seconds = time.process_time() + helper_cpu_seconds()
        if args.steps is None and step in (30, 300, 1000):
            # Plan the schedule from the recent pace (the machine is shared, so it drifts); the log
            # records the final plan so `--steps` can replay it.
            pace = (elapsed - paced[1]) / (step - paced[0])
            paced = (step, elapsed)
            total = max(step + 1, step + int((args.minutes * 60 - elapsed) / pace))
            bar.reset(total=total)
            bar.update(step)
            print(f"[train] {pace:.2f} s/step -> total steps {total} (rerun with --steps {total})", flush=True)
        if args.minutes is not None and elapsed > 1.15 * args.minutes * 60 and step < total:
            print(f"[train] time cap hit at step {step} of {total}; saving early", flush=True)
            total = step
        if args.stop_after is not None and step >= args.stop_after and step < total:
            total = step  # the learning rate followed the full schedule up to here
        if args.cpu_minutes is not None and cpu_seconds > args.cpu_minutes * 60 and step < total:
            print(f"[train] CPU-time cap hit at step {step} of {total}; saving early", flush=True)
            total = step
        bar.update(1)
        bar.set_postfix(lm=f"{lm.item():.3f}", aux=f"{aux_loss.item():.3f}", attn=f"{attn_loss.item():.3f}")
        with open(log_path, "a", newline="") as f:
            csv.writer(f).writerow([step, f"{elapsed:.1f}", f"{cpu_seconds:.1f}",
                                    f"{opt.param_groups[0]['lr']:.2e}", f"{lm.item():.4f}", f"{aux_loss.item():.4f}",
                                    f"{attn_loss.item():.4f}", f"{place_loss.item():.4f}"])
        if step % args.eval_every == 0 or step == total:
            acc = evaluate_batches(model, held_out, aux)
            print(f"[eval step {step}] " + " ".join(f"{k}={v:.2f}" for k, v in acc.items()), flush=True)
            new = not eval_path.exists()
            with open(eval_path, "a", newline="") as f:
                w = csv.writer(f)
                if new:
                    w.writerow(["step", *acc])
                w.writerow([step, *(f"{v:.3f}" for v in acc.values())])
            if step < total:  # a run stopped early still leaves its last evaluated state
                save_checkpoint(model, tokenizer, processor, out, logs=[log_path, eval_path])
    bar.close()
    save_checkpoint(model, tokenizer, processor, out, logs=[log_path, eval_path])
    shutil.rmtree(log_dir, ignore_errors=True)
    if stream:
        stream.close()
    print(f"[train] saved {out} after {step} steps in {(time.time() - start) / 60:.1f} min "
          f"({(time.process_time() + helper_cpu_seconds()) / 60:.1f} CPU min for the whole process)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description="Train vlserve's built-in LLaVA-format model on generated scenes.")
    p.add_argument("--out", required=True, help="checkpoint directory (written atomically at the end)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="total steps (deterministic schedule)")
    p.add_argument("--minutes", type=float, default=None, help="time budget, turned into steps after 30 steps")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=150, help="steps of linear learning-rate warm-up")
    p.add_argument("--aux-weight", type=float, default=1.0)
    p.add_argument("--count-weight", type=float, default=0.0,
                   help="weight, within the auxiliary loss, of the counts read from each picture's mean patch "
                        "(0: not trained)")
    p.add_argument("--density-weight", type=float, default=0.0,
                   help="weight, within the auxiliary loss, of each patch's share of the shapes' mass, read "
                        "linearly from that patch (a density map summing to the count; 0: not trained)")
    p.add_argument("--attn-weight", type=float, default=1.0, help="weight of the attention supervision loss")
    p.add_argument("--place-weight", type=float, default=0.0,
                   help="weight of the relation place read-out's loss (place_targets.py; 0: not trained)")
    p.add_argument("--eval-every", type=int, default=1000)
    p.add_argument("--patch", type=int, default=16, help="vision patch size")
    p.add_argument("--image-size", type=int, default=IMAGE_SIZE, help="side of the model's input picture")
    p.add_argument("--vision-warmup", type=int, default=800, help="aux-only steps before the decoder trains")
    p.add_argument("--text-layers", type=int, default=None,
                   help="decoder depth (default: the --init checkpoint's, or 4); layers past the checkpoint's"
                        " start as the identity")
    p.add_argument("--vision-layers", type=int, default=None,
                   help="vision tower depth (default: the --init checkpoint's, or 4); the same")
    p.add_argument("--init", default=None,
                   help="start from this checkpoint (same model shape, or fewer layers; --image-size may differ)")
    p.add_argument("--cpu-minutes", type=float, default=None,
                   help="a guard: stop and save once the process has used this much CPU time")
    p.add_argument("--stop-after", type=int, default=None,
                   help="stop and save after this many steps of the --steps schedule (a first stage)")
    p.add_argument("--multi-scene-share", type=float, default=0.0,
                   help="share of image batches whose rows bring a new picture every turn (few-shot prompts)")
    p.add_argument("--typed-share", type=float, default=0.0,
                   help="share of scenes from vlserve/builtin/typed.py (crowded, relations, out-of-world, "
                        "typed phrasing)")
    p.add_argument("--crowded-share", type=float, default=typed.CROWDED_SHARE,
                   help="share of typed.py's drawn pictures that are crowded (--crowded-counts smaller shapes)")
    p.add_argument("--crowded-counts", type=int, nargs="+", default=list(typed.CROWDED_COUNTS), metavar="N",
                   help="how many shapes a crowded picture has, one of these drawn evenly")
    p.add_argument("--crowded-repeat-share", type=float, default=typed.CROWDED_REPEAT_SHARE,
                   help="share of crowded pictures whose colours are drawn with repeats (several shapes of one colour)")
    p.add_argument("--plain-repeat-share", type=float, default=typed.PLAIN_REPEAT_SHARE,
                   help="the same, of typed.py's other pictures of two shapes or more")
    p.add_argument("--size-ratio", type=float, default=typed.SIZE_RATIO,
                   help="typed.py asks for the biggest (smallest) shape when its visible area is this many times "
                        "the next one's (under it)")
    p.add_argument("--qtype-weight", nargs="+", default=[], metavar="QTYPE=W",
                   help="loss weight of a question type's answers, overriding QTYPE_WEIGHT")
    p.add_argument("--turn-priority", nargs="+", default=[], metavar="QTYPE=W",
                   help="how much likelier a question type is among a sequence's turns (TURN_PRIORITY)")
    p.add_argument("--bf16", action="store_true",
                   help="forward and backward under bfloat16 autocast (fast on CPUs with AMX); weights, "
                        "optimizer and evaluation stay fp32")
    p.add_argument("--data-worker", action="store_true",
                   help="draw batches in a child process a few steps ahead (for a run that has a core to spare)")
    a = p.parse_args()
    if (a.steps is None) == (a.minutes is None):
        p.error("give exactly one of --steps or --minutes")
    train(TrainArgs(out=a.out, seed=a.seed, steps=a.steps, minutes=a.minutes, threads=a.threads, lr=a.lr,
                    warmup=a.warmup, aux_weight=a.aux_weight, count_weight=a.count_weight,
                    density_weight=a.density_weight, attn_weight=a.attn_weight,
                    place_weight=a.place_weight, eval_every=a.eval_every,
                    patch=a.patch, image_size=a.image_size,
                    vision_warmup=a.vision_warmup, text_layers=a.text_layers, vision_layers=a.vision_layers,
                    init=a.init,
                    cpu_minutes=a.cpu_minutes, stop_after=a.stop_after, multi_scene_share=a.multi_scene_share,
                    typed_share=a.typed_share, crowded_share=a.crowded_share, size_ratio=a.size_ratio,
                    crowded_counts=tuple(a.crowded_counts), crowded_repeat_share=a.crowded_repeat_share,
                    plain_repeat_share=a.plain_repeat_share,
                    bf16=a.bf16, data_worker=a.data_worker,
                    qtype_weight=_overrides(p, a.qtype_weight, QTYPE_WEIGHT),
                    turn_priority=_overrides(p, a.turn_priority, QTYPE_WEIGHT)))


def _overrides(parser: argparse.ArgumentParser, pairs: list[str], known: dict[str, float]) -> dict[str, float]:
    """`["position=3", ...]` as {"position": 3.0}; an unknown question type is an error."""
    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in known:
            parser.error(f"unknown question type {name!r} in {pair!r}; known: {', '.join(sorted(known))}")
        try:
            out[name] = float(value)
        except ValueError:
            parser.error(f"{pair!r}: the weight after '=' must be a number")
    return out


if __name__ == "__main__":
    main()
