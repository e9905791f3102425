"""The validator service: checks every submitted config and publishes the verdict."""
