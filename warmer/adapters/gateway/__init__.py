"""Router integrations: GatewayPort implementations."""
