"""Example toolsets for the ``python`` environment (``orders``: a toy order-support
shop), registered in the ``reef.environment_tools`` entry-point group like a plugin's."""
