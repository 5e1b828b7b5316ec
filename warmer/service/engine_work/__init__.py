"""Requests to engines that warm and prove: a prefix warmed and verified, a fresh process warmed up."""
