//! The balancer's port: garbage, resets mid-way, many idle clients, slow peers.
