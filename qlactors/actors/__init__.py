"""The six pykka actors of a qlactors runtime and the in-process messages between them."""
