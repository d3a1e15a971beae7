// Keeps chorus_test_util non-empty.
