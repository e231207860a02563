"""Role prefixes and suffixes a program's text is rendered with (SGLang's ChatTemplate)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    default_system_prompt: str | None = None
    stop_str: tuple[str, ...] = ()
    image_token: str = "<image>\n"
    video_token: str = "<video>\n"

    def get_prefix_and_suffix(self, role: str, hist_messages: list | None = None) -> tuple[str, str]:
        if role not in self.role_prefix_and_suffix:
            raise ValueError(f"chat template {self.name!r} has no role {role!r}")
        return self.role_prefix_and_suffix[role]


# vlserve's LLaVA models (the built-in one included): "USER: <image>\n{question} ASSISTANT: {answer}</s>".
# The assistant prefix ends where the model's generation prompt ends ("ASSISTANT:"), so a gen's text
# starts with the space the model was trained to write.
VICUNA = ChatTemplate(
    "vicuna_v1.1",
    {"system": ("", " "), "user": ("USER: ", " "), "assistant": ("ASSISTANT:", "</s>")},
)

# Plain role markers, for OpenAI-compatible models whose template is unknown.
DEFAULT = ChatTemplate(
    "default",
    {"system": ("SYSTEM:", "\n"), "user": ("USER:", "\n"), "assistant": ("ASSISTANT:", "\n")},
)

TEMPLATES = {t.name: t for t in (VICUNA, DEFAULT)}


def get_chat_template(name: str) -> ChatTemplate:
    if name not in TEMPLATES:
        raise ValueError(f"unknown chat template {name!r}; known: {sorted(TEMPLATES)}")
    return TEMPLATES[name]
