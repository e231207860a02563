"""vlserve: a serving system for vision-language models."""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy: `import vlserve` stays cheap (the CLI, the preprocess workers) until Engine is used.
    if name == "Engine":
        from vlserve.engine.engine import Engine

        return Engine
    raise AttributeError(name)
