//! The PROXY protocol header reader: lying lengths, trickled and garbage headers.
