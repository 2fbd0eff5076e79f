"""The throwaway certificate authority lives in playground/certs.py; this name stays for the
tests that import it from here."""

from playground.certs import CertAuthority, KeyPair, service_account_key

__all__ = ["CertAuthority", "KeyPair", "service_account_key"]
