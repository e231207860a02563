"""The package layout; everything else (metadata, dependencies, package data) is in pyproject.toml.

setuptools finds the packages: every folder under vlserve/, and the top-level kernels/ and
preprocess/ folders with their subfolders installed as vlserve.kernels.* and vlserve.preprocess.*,
so they never shadow PyPI packages (transformers >= 5.25 imports Hugging Face's `kernels`).
Folders are found as namespace packages, so data folders (vlserve/builtin_model,
vlserve/server/static, kernels/csrc) are packages whose files pyproject.toml's package-data names.
"""

from setuptools import find_namespace_packages, setup

MAPPED = {"vlserve.kernels": "kernels", "vlserve.preprocess": "preprocess"}  # installed name: folder
NOT_PACKAGES = ["__pycache__", "*.__pycache__"]


def packages() -> list[str]:
    found = find_namespace_packages(include=["vlserve", "vlserve.*"], exclude=NOT_PACKAGES)
    for name, folder in MAPPED.items():
        found += [name] + [f"{name}.{sub}" for sub in find_namespace_packages(folder, exclude=NOT_PACKAGES)]
    return found


setup(package_dir={"vlserve": "vlserve", **MAPPED}, packages=packages())
