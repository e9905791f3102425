"""The sandbox backends behind one interface (``base.Backend``): local (bubblewrap), docker, kubernetes."""
