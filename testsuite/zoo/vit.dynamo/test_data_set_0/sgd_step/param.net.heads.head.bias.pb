
Bnet.heads.head.biasJ(‹ª<|$;± C½Éh#½:}=Xö¼u”½™¬Ì¼üZ(=|Ş·»