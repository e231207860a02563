"""The constant prefix of a program: what it appends before anything depends on its arguments or on
the model. run_batch sends it once, before the batch, so every program hits it in the cache."""

from dataclasses import dataclass, field

from vlserve.lang.backend.base import BaseBackend
from vlserve.lang.executor import StreamExecutor
from vlserve.lang.ir import default_sampling_params
from vlserve.lang.state import ProgramState


class StopTracing(Exception):
    """Raised where the prefix stops being constant."""


@dataclass
class TracedPrefix:
    text: str
    media: list = field(default_factory=list)


class Unknown:
    """An argument's stand-in: using it in any way ends the constant prefix."""

    def __init__(self, name: str):
        self._name = name

    def _stop(self, *args, **kwargs):
        raise StopTracing(self._name)

    __str__ = __format__ = __add__ = __radd__ = __iter__ = __getitem__ = __getattr__ = __len__ = _stop
    __bool__ = __int__ = __float__ = __index__ = __eq__ = __lt__ = __gt__ = __mul__ = __call__ = _stop
    __hash__ = object.__hash__


class TracingBackend(BaseBackend):
    """Every call to the model ends the prefix."""

    def __init__(self, chat_template):
        self.chat_template = chat_template

    def generate(self, s, sampling_params):
        raise StopTracing("gen")

    def generate_stream(self, s, sampling_params):
        raise StopTracing("gen")

    def select(self, s, choices, temperature, choices_method):
        raise StopTracing("select")

    def commit_lazy_operations(self, s):
        raise StopTracing("fork")


def trace_prefix(program, backend) -> TracedPrefix:
    exe = StreamExecutor(TracingBackend(backend.get_chat_template()), {}, default_sampling_params(),
                         use_thread=False)
    state = ProgramState(exe)
    args = {name: Unknown(name) for name in program.arg_names}
    args.update(program.bind_arguments)
    try:
        program.func(state, **args)
    except Exception:  # StopTracing, or the program's own code tripping over an Unknown
        pass
    return TracedPrefix(exe.text_, list(exe.media))
