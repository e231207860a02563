"""What the interpreter asks of a backend."""

from vlserve.lang.chat_template import VICUNA, ChatTemplate


class BaseBackend:
    chat_template: ChatTemplate = VICUNA
    is_chat_model: bool = False

    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template

    def cache_prefix(self, prefix_str: str, media: list = ()) -> None:
        """A hint: prefill this prefix (no output) so later requests share it."""

    def commit_lazy_operations(self, s) -> None:
        """A hint at a fork: prefill the state's text and media so far."""

    def generate(self, s, sampling_params) -> tuple[str, dict]:
        raise NotImplementedError

    def generate_stream(self, s, sampling_params):
        """Yields (new text, meta_info) pieces."""
        raise NotImplementedError

    def select(self, s, choices: list[str], temperature: float, choices_method):
        raise NotImplementedError

    def role_end_generate(self, s) -> None:
        """Chat-model speculative execution: fill the assistant turn's gens (s.chat_spec)."""

    def end_program(self, s) -> None:
        """The state ended."""

    def flush_cache(self) -> bool:
        raise NotImplementedError(f"{type(self).__name__} has no cache to flush")

    def get_server_info(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} has no server info")

    def shutdown(self) -> None:
        pass
