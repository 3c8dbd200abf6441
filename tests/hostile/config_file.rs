//! The config file: hostile and malformed files, at start-up and on reload.
