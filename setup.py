"""The package's layout, which pyproject.toml cannot say alone: the repository keeps its tune spaces in one
top-level folder, ``tune_spaces/`` (the files people read and edit), and the built package carries that folder as
``raycl/tune_spaces/`` (read with importlib.resources by ``raycl.config.spaces_dir``). Everything else —
metadata, dependencies, package data — is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["raycl", "raycl.*"]), "raycl.tune_spaces"],
    package_dir={"raycl.tune_spaces": "tune_spaces"},
)
