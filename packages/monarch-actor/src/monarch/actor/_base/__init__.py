"""The ``_base`` layer of monarch-actor (see the README, "Layers")."""
