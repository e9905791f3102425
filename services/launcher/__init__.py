"""The launcher service: admission, the runner's phases, and the engines that execute runs."""
