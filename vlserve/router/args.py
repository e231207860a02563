"""`vlserve router` options (SGLang's router flag names where it has one)."""

import argparse
from dataclasses import dataclass, field, fields

from vlserve.core.config import _opt


@dataclass
class RouterArgs:
    worker_urls: list[str] = field(default_factory=list, metadata={"help": "the vlserve servers to route to"})
    model_path: str | None = _opt(None, "the model directory or Hugging Face id (org/name), for its tokenizer, chat "
                                        "template and image processor config (no weights are read); default: the "
                                        "path the first worker reports at /get_model_info, which must be readable here")
    revision: str | None = _opt(None, "the branch, tag or commit of a --model-path given as a model id (default: main)")
    chat_template: str | None = _opt(None, "the workers' --chat-template, if they were given one")
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | list[str] | None = _opt(None, "require 'Authorization: Bearer KEY' with one of these keys (the "
                                                 "first is passed on to the workers)", nargs="+")
    cache_threshold: float = _opt(0.3, "share of a request's key a worker must have cached to be chosen for it")
    balance_abs_threshold: int = _opt(64, "loads are unbalanced when max - min is over this ...")
    balance_rel_threshold: float = _opt(1.5, "... and max is over this times min; then the least loaded is chosen")
    max_tree_size: int = _opt(1 << 22, "tokens each worker's approximate tree keeps (LRU beyond)")
    health_check_interval_secs: float = _opt(2.0, "seconds between health checks of every worker")
    allow_url_fetch: bool = _opt(False, "fetch http(s) image URLs to key requests on them (else such a request "
                                        "is routed by load; the worker fetches as its own flags allow)")
    log_level: str = "info"

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in fields(cls):
            flag, kw = "--" + f.name.replace("_", "-"), {"dest": f.name, "help": f.metadata.get("help")}
            if f.name == "worker_urls":
                parser.add_argument(flag, nargs="+", required=True, **kw)
            elif f.type is bool or f.type == "bool":
                parser.add_argument(flag, action="store_true", default=f.default, **kw)
            else:
                kind = int if "int" in str(f.type) else float if "float" in str(f.type) else str
                parser.add_argument(flag, type=kind, default=f.default, **kw)

    @classmethod
    def from_cli(cls, ns: argparse.Namespace) -> "RouterArgs":
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls)})
