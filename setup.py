"""Maps the top-level folders hw/, host/ and sim/ to one import namespace: ringgpt.hw, ringgpt.host, ringgpt.sim.

Installing the project never puts a bare `hw`, `host` or `sim` module into site-packages.
"""
from setuptools import find_packages, setup

FOLDERS = {"hw": "ringgpt.hw", "host": "ringgpt.host", "sim": "ringgpt.sim"}

packages, package_dir = [], {}
for folder, name in FOLDERS.items():
    package_dir[name] = folder
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir, include_package_data=True,
      package_data={"ringgpt.host": ["data/**/*"], "ringgpt.hw": ["data/**/*"]})
