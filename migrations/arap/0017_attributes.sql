-- subject attributes: the PDP looks a subject up by user name or e-mail
-- address at evaluation time (directory.Store.Find), so the address needs an
-- index as the name has one.
CREATE INDEX users_email ON arap.users (email);
