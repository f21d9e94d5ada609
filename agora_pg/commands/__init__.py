"""What the ``agora-pg`` subcommands do; ``agora_pg.cli`` parses arguments and calls them."""
