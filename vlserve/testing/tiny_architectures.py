"""`vlserve make-tiny-model --arch`: each architecture's tiny random checkpoint writer, in one table.

Importing this module loads neither torch nor transformers (the CLI reads its choices from it).
"""

from vlserve.testing import tiny_anyres
from vlserve.testing.tiny import TinyModelSpec, make_tiny_llava
from vlserve.testing.tiny_qwen_vl import QWEN_ARCHS, make_tiny_qwen_vl


def _anyres(write):
    def writer(out_dir: str, seed: int, spec: TinyModelSpec, layout: str, max_shard_size: str | None) -> str:
        if layout != "transformers":
            raise ValueError(f"layout {layout!r} is only written for --arch llava")
        return write(out_dir, seed, spec)
    return writer


def _qwen(arch: str):
    """Qwen-VL sizes are their own (TinyQwenVLSpec); only the LLaVA spec's dtype carries over."""
    def writer(out_dir: str, seed: int, spec: TinyModelSpec, layout: str, max_shard_size: str | None) -> str:
        from vlserve.testing.tiny_qwen_vl import TinyQwenVLSpec
        return make_tiny_qwen_vl(out_dir, arch, seed, TinyQwenVLSpec(dtype=spec.dtype), layout)
    return writer


# --arch → the function writing that architecture's checkpoint
ARCHITECTURES = {"llava": make_tiny_llava, "llava-next": _anyres(tiny_anyres.make_tiny_llava_next),
                 "llava-onevision": _anyres(tiny_anyres.make_tiny_llava_onevision),
                 "llava-next-video": _anyres(tiny_anyres.make_tiny_llava_next_video),
                 **{name: _qwen(name) for name in QWEN_ARCHS}}
# --arch → its usual (text, vision) when the command line names none
DEFAULT_TEXT_VISION = {"llava-onevision": ("qwen2", "siglip")}


def make_tiny_checkpoint(out_dir: str, arch: str = "llava", seed: int = 0, spec: TinyModelSpec | None = None,
                         layout: str = "transformers", max_shard_size: str | None = None) -> str:
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; use one of {sorted(ARCHITECTURES)}")
    text, vision = DEFAULT_TEXT_VISION.get(arch, ("llama", "clip"))
    return ARCHITECTURES[arch](out_dir, seed, spec or TinyModelSpec(text=text, vision=vision), layout, max_shard_size)
