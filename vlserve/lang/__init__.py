"""vlserve.lang: LM programs with gen, select, fork/join, images and video (SGLang's frontend API).

    import vlserve.lang as sgl

    @sgl.function
    def colour(s, picture):
        s += sgl.user(sgl.image(picture) + "What colour is the shape?")
        s += sgl.assistant(sgl.gen("answer", max_tokens=8))

    sgl.set_default_backend(sgl.RuntimeEndpoint("http://127.0.0.1:30000"))
    print(colour.run(picture="shape.png", temperature=0)["answer"])
"""

from vlserve.lang.api import (assistant, assistant_begin, assistant_end, flush_cache, function, gen, gen_int,
                              gen_string, get_server_info, image, select, set_default_backend, system, system_begin,
                              system_end, user, user_begin, user_end, video)
from vlserve.lang.backend.base import BaseBackend
from vlserve.lang.backend.engine import EngineBackend
from vlserve.lang.backend.runtime_endpoint import RuntimeEndpoint
from vlserve.lang.chat_template import ChatTemplate, get_chat_template
from vlserve.lang.choices import (greedy_token_selection, token_length_normalized,
                                  unconditional_likelihood_normalized)
from vlserve.lang.global_config import global_config
from vlserve.lang.program import SglFunction
from vlserve.lang.state import ProgramState, ProgramStateGroup


def Engine(*args, **kwargs):
    """vlserve's Engine (in-process); pass it to set_default_backend or run(backend=...)."""
    from vlserve.engine.engine import Engine as _Engine

    return _Engine(*args, **kwargs)


def OpenAI(*args, **kwargs):
    from vlserve.lang.backend.openai import OpenAI as _OpenAI

    return _OpenAI(*args, **kwargs)


__all__ = [
    "assistant", "assistant_begin", "assistant_end", "flush_cache", "get_server_info", "function", "gen", "gen_int",
    "gen_string", "image", "select", "set_default_backend", "system", "system_begin", "system_end", "user",
    "user_begin", "user_end",
    "video", "BaseBackend", "EngineBackend", "RuntimeEndpoint", "OpenAI", "Engine", "ChatTemplate",
    "get_chat_template", "greedy_token_selection", "token_length_normalized",
    "unconditional_likelihood_normalized", "global_config", "SglFunction", "ProgramState", "ProgramStateGroup",
]
