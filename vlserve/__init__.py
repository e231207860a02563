"""vlserve: a serving system for vision-language models."""

from vlserve.shadowed_packages import load_installed_kernels_package

__version__ = "0.1.0"

load_installed_kernels_package()  # before anything imports transformers (see shadowed_packages.py)


def __getattr__(name):
    # Lazy: `import vlserve` stays cheap (the CLI, the preprocess workers) until Engine is used.
    if name == "Engine":
        from vlserve.engine.engine import Engine

        return Engine
    raise AttributeError(name)
