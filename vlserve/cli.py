"""The `vlserve` command: serve, router, generate, make-tiny-model, videoqa, bench."""

import argparse
import json
import sys

from vlserve.core.config import EngineArgs
from vlserve.testing.tiny_architectures import ARCHITECTURES as TINY_ARCHITECTURES
from vlserve.testing.tiny import TEXT_MODELS as TINY_TEXT_MODELS
from vlserve.testing.tiny import VISION_MODELS as TINY_VISION_MODELS
from vlserve.router.args import RouterArgs
from vlserve.server.args import ServerArgs


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each command's own."""
    parser = argparse.ArgumentParser(prog="vlserve", description="Serve vision-language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP server (OpenAI-compatible + native routes)")
    ServerArgs.add_cli_args(serve)

    router = sub.add_parser("router", help="a cache-aware router (images included) in front of running servers")
    RouterArgs.add_cli_args(router)

    gen = sub.add_parser("generate", help="answer one prompt (with images/videos) offline and print the result")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--image", action="append", default=[], help="image file (repeatable)")
    gen.add_argument("--video", action="append", default=[], help="video file (repeatable)")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    EngineArgs.add_cli_args(gen)

    tiny = sub.add_parser("make-tiny-model", help="write a tiny random LLaVA checkpoint (Hugging Face format)")
    tiny.add_argument("dir")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--layout", choices=["transformers", "llava-hf", "published"], default="transformers",
                      help="llava-hf: --arch llava's keys as llava-hf publishes them; published: a Qwen-VL "
                           "checkpoint's config.json and weight names as the Hub's (Qwen2-VL/Qwen2.5-VL flat)")
    tiny.add_argument("--arch", choices=sorted(TINY_ARCHITECTURES), default="llava",
                      help="the architecture (llava: LlavaForConditionalGeneration, llava-next: LLaVA-NeXT anyres, "
                           "llava-onevision: OneVision; qwen2-vl, qwen2.5-vl, qwen3-vl: the Qwen-VL family)")
    tiny.add_argument("--text", choices=sorted(TINY_TEXT_MODELS), default=None,
                      help="the decoder's config class (default: llama; qwen2 for llava-onevision)")
    tiny.add_argument("--vision", choices=list(TINY_VISION_MODELS), default=None,
                      help="the vision tower (default: clip; siglip for llava-onevision)")

    for name, module in (("videoqa", "vlserve.bench.videoqa"), ("bench", "vlserve.bench.cli")):
        p = sub.add_parser(name, help=f"see `vlserve {name} --help`", add_help=False)
        p.set_defaults(module=module)

    return parser, {"serve": serve, "router": router, "generate": gen, "make-tiny-model": tiny}


def main(argv: list[str] | None = None) -> int:
    from vlserve.core.errors import CheckpointError

    try:
        return _run(argv)
    except CheckpointError as e:  # a model that cannot be found or loaded: one line, not a traceback
        print(f"vlserve: error: {e}", file=sys.stderr)
        return 1


def _run(argv: list[str] | None) -> int:
    parser, commands = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command in ("videoqa", "bench"):
        import importlib
        return importlib.import_module(args.module).main(rest)
    if rest:  # the command's own usage, not the top level's
        commands[args.command].error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "serve":
        serve_args = _checked(ServerArgs, args, commands["serve"])
        if serve_args.dp_size > 1:
            from vlserve.router.data_parallel import serve_data_parallel
            return serve_data_parallel(serve_args)
        from vlserve.server.app import run_server
        return run_server(serve_args) or 0
    if args.command == "router":
        from vlserve.router.serve import run_router
        return run_router(_checked(RouterArgs, args, commands["router"]))
    if args.command == "generate":
        return _generate(args, _checked(EngineArgs, args, commands["generate"]))
    if args.command == "make-tiny-model":
        from vlserve.testing.tiny import TinyModelSpec
        from vlserve.testing.tiny_architectures import DEFAULT_TEXT_VISION, make_tiny_checkpoint
        from vlserve.testing.tiny_qwen_vl import QWEN_ARCHS
        if args.arch in QWEN_ARCHS and (args.text or args.vision):
            commands["make-tiny-model"].error(
                f"--text and --vision choose LLaVA's parts; --arch {args.arch} has its own")
        text, vision = DEFAULT_TEXT_VISION.get(args.arch, ("llama", "clip"))
        spec = TinyModelSpec(text=args.text or text, vision=args.vision or vision)
        print(make_tiny_checkpoint(args.dir, args.arch, seed=args.seed, spec=spec, layout=args.layout))
        return 0
    return 2


def parse_serve_args(argv: list[str]) -> ServerArgs:
    """`vlserve serve ARGV` as ServerArgs (exits with a usage error on bad values, as the CLI does)."""
    parser, commands = build_parser()
    return _checked(ServerArgs, parser.parse_args(["serve", *argv]), commands["serve"])


def _checked(args_cls, ns: argparse.Namespace, parser: argparse.ArgumentParser):
    """The options as args_cls; a value it refuses is a usage error, not a traceback."""
    try:
        return args_cls.from_cli(ns)
    except ValueError as e:
        parser.error(str(e))


def _generate(args, engine_args: EngineArgs) -> int:
    from vlserve import Engine
    from vlserve.core.errors import InvalidRequest, MediaError

    engine_args.allowed_media_path = engine_args.allowed_media_path or "/"  # files named here are the user's own
    with Engine(**engine_args.engine_kwargs()) as engine:
        prompt = args.prompt
        if args.chat:
            parts = [{"type": "image"} for _ in args.image] + [{"type": "text", "text": "<video>"} for _ in args.video]
            parts.append({"type": "text", "text": prompt})
            prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": parts}],
                                                          add_generation_prompt=True, tokenize=False)
        try:
            out = engine.generate(prompt=prompt, image_data=args.image or None, video_data=args.video or None,
                                  sampling_params={"max_new_tokens": args.max_new_tokens,
                                                   "temperature": args.temperature})
        except (InvalidRequest, MediaError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
