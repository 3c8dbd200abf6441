//! The interactive prompt: garbage, huge lines and an input that ends.
