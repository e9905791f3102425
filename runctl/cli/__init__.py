"""The ``runctl`` command: one module per command group; ``main`` assembles them."""
