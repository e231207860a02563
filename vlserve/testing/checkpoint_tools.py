"""What the checkpoint writers share — the tiny test checkpoints (testing/tiny.py) and the built-in
model (builtin/): LLaVA's special tokens, the LLaVA-1.5 chat template, a trained byte-level BPE
wrapped as a transformers tokenizer, and CLIP's and SigLIP's image-processor settings."""

from vlserve.preprocess import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

BOS, EOS, UNK, PAD, IMAGE_TOKEN = "<s>", "</s>", "<unk>", "<pad>", "<image>"

# LLaVA-1.5: "<s>USER: <image>\nWhat is this? ASSISTANT: It is a cat.</s>". Images render where
# their parts stand in the message, followed by a newline after a run of images.
LLAVA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '\\n' }}"
    "{% else %}"
    "{{ message['role'].upper() }}: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}<image>"
    "{% if loop.last or message['content'][loop.index0 + 1]['type'] not in ('image', 'image_url') %}"
    "{{ '\\n' }}{% endif %}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% else %}{{ ' ' }}{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def llava_tokenizer(tok, model_max_length: int, unk: bool = True, **kwargs):
    """A trained `tokenizers.Tokenizer` as a transformers tokenizer with LLaVA's special tokens and
    chat template (unk: whether the vocabulary has <unk>)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   **({"unk_token": UNK} if unk else {}),
                                   extra_special_tokens={"image_token": IMAGE_TOKEN},
                                   model_max_length=model_max_length, **kwargs)
    fast.chat_template = LLAVA_CHAT_TEMPLATE
    return fast


def clip_image_processor_kwargs(image_size: int) -> dict:
    """CLIP's processing at image_size: resize the short side, centre-crop, rescale, normalise."""
    return {"do_resize": True, "size": {"shortest_edge": image_size}, "resample": 3, "do_center_crop": True,
            "crop_size": {"height": image_size, "width": image_size}, "do_rescale": True,
            "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
            "image_mean": list(OPENAI_CLIP_MEAN), "image_std": list(OPENAI_CLIP_STD)}


def siglip_image_processor_kwargs(image_size: int) -> dict:
    """SigLIP's processing at image_size: resize to exactly image_size square, rescale, normalise 0.5/0.5."""
    return {"do_resize": True, "size": {"height": image_size, "width": image_size}, "resample": 3,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
            "image_mean": list(IMAGENET_STANDARD_MEAN), "image_std": list(IMAGENET_STANDARD_STD)}
