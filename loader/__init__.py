"""PySpark bulk loader of subscriptions (issue [4/4])."""
