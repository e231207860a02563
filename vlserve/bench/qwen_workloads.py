"""The workloads (workload_defs.py) written in Qwen-VL's chat format, for a Qwen-VL checkpoint.

Each Job keeps its media, its shared parts and its length in turns; only the markup changes, as
Qwen2.5-VL's chat template writes it: a turn opens with `<|im_start|>user\\n` / closes with
`<|im_end|>\\n`, the answer is prompted by `<|im_start|>assistant\\n`, and each picture or video stands
where it is as `<|vision_start|><|image_pad|><|vision_end|>` / `...<|video_pad|>...` (the processor
expands a pad to the picture's t*h*w/4 tokens). No default system turn is added: it would give every
workload, zero_reuse too, a shared prefix the LLaVA workloads do not have.
"""

from dataclasses import replace

from vlserve.bench import workload_defs as W
from vlserve.bench.client import Job

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
# LLaVA markup (workload_defs' prompts) → Qwen's, applied in this order
MARKUP = (("<image>\n", IMAGE), ("<video>\n", VIDEO), ("<image>", IMAGE), ("<video>", VIDEO),
          ("</s>USER: ", "<|im_end|>\n<|im_start|>user\n"), ("USER: ", "<|im_start|>user\n"),
          (" ASSISTANT: ", "<|im_end|>\n<|im_start|>assistant\n"),
          (" ASSISTANT:", "<|im_end|>\n<|im_start|>assistant\n"), ("</s>", "<|im_end|>\n"))


def qwen_prompt(llava_prompt: str) -> str:
    """A workload prompt in Qwen-VL's chat markup (text outside the markers unchanged)."""
    out = llava_prompt
    for old, new in MARKUP:
        out = out.replace(old, new)
    return out


def qwen_jobs(jobs: list[Job]) -> list[Job]:
    return [replace(j, prompt=qwen_prompt(j.prompt)) for j in jobs]


def qwen_workload(name: str, scale: float = 1.0) -> list[Job]:
    """The workload `name` (scaled as workload_defs.scaled) in Qwen-VL's markup."""
    return qwen_jobs(W.scaled(name, scale))


# workloads.py --family: the LLaVA benchmark models (models.SPECS), or this one (qwen_models.py)
FAMILY = "qwen2.5-vl"
FAMILIES = ("llava", FAMILY)
QWEN_SYSTEMS = ("vlserve-lpm", "vlserve-fcfs", "vlserve-nocache", "vllm")  # the peers that serve Qwen2.5-VL here


def family_workload(family: str, name: str, scale: float = 1.0) -> list[Job]:
    """The workload's Jobs for a family's checkpoint: in its chat markup for Qwen2.5-VL."""
    return qwen_workload(name, scale) if family == FAMILY else W.scaled(name, scale)
