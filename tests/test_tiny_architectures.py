"""`vlserve make-tiny-model --arch A` writes each family's checkpoint as transformers saves it, and the
loader serves it by that family (the architecture name in config.json picks the model class)."""

import json
import subprocess
import sys

import pytest

from vlserve.model.loader import load_model

ARCHES = {  # --arch -> (config.json architecture, model_type, text, vision by default)
    "llava-next": ("LlavaNextForConditionalGeneration", "llava_next", "llama", "clip_vision_model"),
    "llava-onevision": ("LlavaOnevisionForConditionalGeneration", "llava_onevision", "qwen2", "siglip_vision_model"),
    "llava-next-video": ("LlavaNextVideoForConditionalGeneration", "llava_next_video", "llama", "clip_vision_model"),
}


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_cli_writes_each_family_and_the_loader_serves_it(arch, tmp_path):
    out = subprocess.run([sys.executable, "-m", "vlserve", "make-tiny-model", str(tmp_path), "--arch", arch],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    config = json.loads((tmp_path / "config.json").read_text())
    architecture, model_type, text, vision = ARCHES[arch]
    assert config["architectures"] == [architecture] and config["model_type"] == model_type
    assert config["text_config"]["model_type"] == text and config["vision_config"]["model_type"] == vision
    loaded = load_model(str(tmp_path))
    assert loaded.family.architecture == architecture
    assert loaded.config.anyres is not None  # tiles: the token count depends on the picture
