"""The shop: an example application that embeds outboxq (its own `app` package, model and migrations)."""
