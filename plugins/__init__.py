"""Built-in flowsvc plugins."""
