"""PySpark bulk loader of subscriptions."""
