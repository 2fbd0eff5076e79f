"""The playground (playground/, docs/playground.md): the README's cluster section run against it."""
