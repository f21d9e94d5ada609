"""Job families of the example application (see agora_pg.families)."""
