"""What the tests share: one way to wait, and the private servers a test run brings."""
