"""Packaging glue pyproject.toml cannot express: the shipped cascades and architecture
specs live at the top of the repo (cascades/, archs/) and travel in a wheel as package
data under mambalaya/data/ (mambalaya/fileio.py looks in both places)."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["mambalaya", "mambalaya.*"])
    + ["mambalaya.data.cascades", "mambalaya.data.archs"],
    package_dir={"mambalaya.data.cascades": "cascades", "mambalaya.data.archs": "archs"},
    package_data={"mambalaya.data.cascades": ["*.yaml"], "mambalaya.data.archs": ["*.yaml"]},
)
