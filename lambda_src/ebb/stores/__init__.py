"""Storage back ends behind the engine's interfaces: local ones here, AWS ones beside them."""
