Bnet.bn1.weightJ 59Z;‹a›¹½w
;lû6980r:öÂ¡¸4¡~»l¢º