def includeme(config):
    config.add_route('home', '/')
    config.add_route('rename', '/rename')
    config.add_route('price', '/price')
    config.add_route('bump', '/bump')
