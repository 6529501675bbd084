"""Front end: a kernel's Python source -> IR (AST with user positions + outlined InCore regions), with the
placement rules the real compiler enforces reported at the user's file:line:col."""
