//! The demo backend: slow, partial and garbage requests.
