"""Auth: sign-in with a wallet (SIWE), the messaging platform or an access code; JWT sessions."""
