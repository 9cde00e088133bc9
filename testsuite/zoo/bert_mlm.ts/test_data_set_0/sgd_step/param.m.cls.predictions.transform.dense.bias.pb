 B&m.cls.predictions.transform.dense.biasJ€ëì;Y[C<ýM
=ßi¡¼?65¼W*c;|Væ<ê-;L>±;®¨:<6sC<r:H;D5œ¼¯|K½sx8<ø4=yƒç¼f£<)¼ks0¼âî=pŒí<cìm<D¤›¹¡È+½G2x<oC°¼öæs»»8w»ÎnÛ¼ÓÊ<c.‹»