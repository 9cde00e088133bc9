B
bn1.weightJ I¿t»þ¼X9&µi<ËO§¼°_õ:¶²":öã»áz<